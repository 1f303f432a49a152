// numbers_server: serves zrpc.examples.Numbers (proto/examples/numbers.proto): a streaming rpc
// of each kind and a unary one.
//
//   numbers_server [--listen ADDR:PORT] [--threads N] [--form blocking|async]
//
// --form async serves the same rpcs from Numbers::AsyncService: each stream is an object driven
// by its own callbacks, with no thread of its own (rpc/streaming.h, "Asynchronous server
// streams").
//
// Prints "listening on ADDR:PORT" once it accepts calls, then serves until SIGINT or SIGTERM,
// gives the calls in flight 5 s to finish, and exits 0 (serve.h). See examples/README.md.
#include <cstdint>
#include <memory>
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
    "usage: numbers_server [--listen ADDR:PORT] [--threads N] [--form blocking|async]\n"
    "  --listen ADDR:PORT  an address of the RDMA device and a port (0: any free one);\n"
    "                      default: the device's address (ZRPC_RDMA_ADDR), port 7471\n"
    "  --threads N         handler threads, 1 to 256 (default 4)\n"
    "  --form F            blocking (default): each stream's handler runs on a thread of its\n"
    "                      own; async: streams are driven by callbacks, with no thread each\n";

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

// The same service in the asynchronous form. Each stream is an object that owns its call, starts
// the next Read or Write from the callback of the last, and deletes itself once it has finished
// the call. Callbacks run on runtime threads and must not block.
class Counter {
 public:
  explicit Counter(std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> call)
      : call_(std::move(call)) {
    number_.set_pad(std::string(call_->request().pad_bytes(), 'n'));
  }
  void Next() {
    const CountRequest& request = call_->request();
    if (sent_ == request.count()) return Done(absl::OkStatus());
    if (request.fail_after() > 0 && sent_ == static_cast<uint64_t>(request.fail_after())) {
      return Done(absl::AbortedError(absl::StrCat("failed after ", sent_, " numbers, as asked")));
    }
    number_.set_value(request.start() + sent_++);
    // The callback runs once the client has room and the number has gone: the next one then.
    call_->Write(number_, [this](bool ok) {
      if (!ok) return Done(absl::UnavailableError("the client went away or gave up"));
      Next();
    });
  }

 private:
  void Done(absl::Status status) {
    call_->Finish(std::move(status));
    delete this;  // allowed from its own callback: Finish has been recorded
  }

  std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> call_;
  Number number_;
  uint64_t sent_ = 0;
};

class Summer {
 public:
  explicit Summer(std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call)
      : call_(std::move(call)) {}
  void Next() {
    call_->Read(&number_, [this](bool ok) {
      if (!ok) {  // the client's WritesDone (or it gave up): answer the total
        call_->Finish(absl::OkStatus());
        delete this;
        return;
      }
      Total* total = call_->response();
      total->set_sum(total->sum() + number_.value());
      total->set_count(total->count() + 1);
      Next();
    });
  }

 private:
  std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call_;
  Number number_;
};

class Doubler {
 public:
  explicit Doubler(std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call)
      : call_(std::move(call)) {}
  void Next() {
    call_->Read(&number_, [this](bool ok) {
      if (!ok) return Done(absl::OkStatus());
      number_.set_value(2 * number_.value());
      call_->Write(number_, [this](bool sent) {
        if (!sent) return Done(absl::UnavailableError("the client went away"));
        Next();
      });
    });
  }

 private:
  void Done(absl::Status status) {
    call_->Finish(std::move(status));
    delete this;
  }

  std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call_;
  Number number_;
};

class AsyncNumbersImpl final : public Numbers::AsyncService {
 public:
  void Count(std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> call) override {
    (new Counter(std::move(call)))->Next();
  }
  void Sum(std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call) override {
    (new Summer(std::move(call)))->Next();
  }
  void Double(std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call) override {
    (new Doubler(std::move(call)))->Next();
  }
  void Square(std::unique_ptr<zrpc::PendingCall<Number, Number>> call) override {
    call->response()->set_value(call->request().value() * call->request().value());
    call->Finish(absl::OkStatus());
  }
};

}  // namespace

int main(int argc, char** argv) {
  zrpc::examples::cli::CommandLine args("numbers_server", kUsage);
  if (!args.Parse(argc, argv, {"listen", "threads", "form"})) return args.exit_code();
  zrpc::ServerOptions options;
  if (auto error = zrpc::examples::ApplyServerFlags(args, &options)) return args.UsageError(*error);
  const std::string* form = args.Find("form");
  const bool async = form != nullptr && *form == "async";
  if (form != nullptr && !async && *form != "blocking") {
    return args.UsageError("--form is blocking or async, not '" + *form + "'");
  }

  // First, before any thread starts: every thread inherits the blocked signals.
  const sigset_t stop_signals = zrpc::examples::cli::BlockStopSignals();
  NumbersImpl numbers;  // outlive the server, which only borrows one
  AsyncNumbersImpl async_numbers;
  zrpc::Service* service = async ? static_cast<zrpc::Service*>(&async_numbers) : &numbers;
  return zrpc::examples::ServeUntilStopped("numbers_server", options, service, stop_signals);
}
