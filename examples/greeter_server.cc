// greeter_server: serves zrpc.examples.Greeter (proto/examples/greeter.proto), blocking form.
//
//   greeter_server [--listen ADDR:PORT] [--threads N]
//
// Prints "listening on ADDR:PORT" once it accepts calls, then serves until SIGINT or SIGTERM,
// gives the calls in flight 5 s to finish, and exits 0 (serve.h). See examples/README.md.
#include "absl/status/status.h"
#include "examples/cli.h"
#include "examples/serve.h"
#include "proto/examples/greeter.zrpc.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

constexpr char kUsage[] =
    "usage: greeter_server [--listen ADDR:PORT] [--threads N]\n"
    "  --listen ADDR:PORT  an address of the RDMA device and a port (0: any free one);\n"
    "                      default: the device's address (ZRPC_RDMA_ADDR), port 7471\n"
    "  --threads N         handler threads, 1 to 256 (default 4)\n";

// The service: one override per rpc. Handlers run on the server's handler threads, several at
// once, so anything they share needs a lock (these share nothing).
class GreeterImpl final : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext&, const HelloRequest& request,
                        HelloReply* reply) override {
    reply->set_message("Hello, " + request.name());
    return absl::OkStatus();
  }

  absl::Status Ping(zrpc::ServerContext&, const google::protobuf::Empty&,
                    google::protobuf::Empty*) override {
    return absl::OkStatus();
  }
};

}  // namespace

int main(int argc, char** argv) {
  zrpc::examples::cli::CommandLine args("greeter_server", kUsage);
  if (!args.Parse(argc, argv, {"listen", "threads"})) return args.exit_code();
  zrpc::ServerOptions options;
  if (auto error = zrpc::examples::ApplyServerFlags(args, &options)) return args.UsageError(*error);

  // First, before any thread starts: every thread inherits the blocked signals.
  const sigset_t stop_signals = zrpc::examples::cli::BlockStopSignals();
  GreeterImpl greeter;  // outlives the server, which only borrows it
  return zrpc::examples::ServeUntilStopped("greeter_server", options, &greeter, stop_signals);
}
