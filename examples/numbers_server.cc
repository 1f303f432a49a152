// numbers_server: serves zrpc.examples.Numbers (proto/examples/numbers.proto): a streaming rpc
// of each kind and a unary one.
//
//   numbers_server [--listen ADDR:PORT] [--threads N]
//
// Prints "listening on ADDR:PORT" once it accepts calls, then serves until SIGINT or SIGTERM,
// gives the calls in flight 5 s to finish, and exits 0 (serve.h). See README.md, "Examples".
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "examples/cli.h"
#include "examples/serve.h"
#include "proto/examples/numbers.zrpc.h"

namespace {

using zrpc::examples::CountRequest;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;

constexpr char kUsage[] =
    "usage: numbers_server [--listen ADDR:PORT] [--threads N]\n"
    "  --listen ADDR:PORT  an address of the RDMA device and a port (0: any free one);\n"
    "                      default: the device's address (ZRPC_RDMA_ADDR), port 7471\n"
    "  --threads N         handler threads for the unary rpc, 1 to 256 (default 4); each\n"
    "                      stream's handler runs on a thread of its own\n";

// Each streaming handler runs on a thread of its own for as long as its stream lasts, and
// returns the call's status; a Write or Read that fails means the client is gone or gave up.
class NumbersImpl final : public Numbers::Service {
 public:
  // Server streaming: `count` numbers, the client reading at its own pace (a full window makes
  // Write wait).
  absl::Status Count(zrpc::ServerContext& context, const CountRequest& request,
                     zrpc::ServerWriter<Number>* writer) override {
    Number number;
    number.set_pad(std::string(request.pad_bytes(), 'n'));
    for (uint64_t i = 0; i < request.count(); ++i) {
      if (request.fail_after() > 0 && i == static_cast<uint64_t>(request.fail_after())) {
        return absl::AbortedError(absl::StrCat("failed after ", i, " numbers, as asked"));
      }
      if (request.delay_us() > 0) absl::SleepFor(absl::Microseconds(request.delay_us()));
      number.set_value(request.start() + i);
      if (!writer->Write(number)) {
        return context.IsCancelled() ? absl::CancelledError("the client gave up")
                                     : absl::UnavailableError("the client went away");
      }
    }
    return absl::OkStatus();
  }

  // Client streaming: reads until the client's WritesDone, then answers once.
  absl::Status Sum(zrpc::ServerContext&, zrpc::ServerReader<Number>* reader,
                   Total* total) override {
    Number number;
    while (reader->Read(&number)) {
      total->set_sum(total->sum() + number.value());
      total->set_count(total->count() + 1);
    }
    return absl::OkStatus();
  }

  // Bidirectional: each number back, doubled, as it comes.
  absl::Status Double(zrpc::ServerContext&,
                      zrpc::ServerReaderWriter<Number, Number>* stream) override {
    Number number;
    while (stream->Read(&number)) {
      number.set_value(2 * number.value());
      if (!stream->Write(number)) return absl::UnavailableError("the client went away");
    }
    return absl::OkStatus();
  }

  absl::Status Square(zrpc::ServerContext&, const Number& request, Number* reply) override {
    reply->set_value(request.value() * request.value());
    return absl::OkStatus();
  }
};

}  // namespace

int main(int argc, char** argv) {
  zrpc::examples::cli::CommandLine args("numbers_server", kUsage);
  if (!args.Parse(argc, argv, {"listen", "threads"})) return args.exit_code();
  zrpc::ServerOptions options;
  if (auto error = zrpc::examples::ApplyServerFlags(args, &options)) return args.UsageError(*error);

  // First, before any thread starts: every thread inherits the blocked signals.
  const sigset_t stop_signals = zrpc::examples::cli::BlockStopSignals();
  NumbersImpl numbers;  // outlives the server, which only borrows it
  return zrpc::examples::ServeUntilStopped("numbers_server", options, &numbers, stop_signals);
}
