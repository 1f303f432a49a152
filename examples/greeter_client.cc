// greeter_client: calls zrpc.examples.Greeter.SayHello (proto/examples/greeter.proto).
//
//   greeter_client --connect ADDR:PORT [--name NAME] [--calls N]
//
// Makes N blocking calls one after the other, each with a 5 s deadline, and prints each reply
// and then "N calls ok" (exit 0), or the first error (exit 1). See examples/README.md.
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "examples/cli.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

constexpr char kUsage[] =
    "usage: greeter_client --connect ADDR:PORT [--name NAME] [--calls N]\n"
    "  --connect ADDR:PORT  the server (what greeter_server printed after \"listening on\")\n"
    "  --name NAME          who to greet (default \"world\")\n"
    "  --calls N            calls to make, one after the other, 1 to 1000000 (default 1)\n";

constexpr absl::Duration kDeadline = absl::Seconds(5);

}  // namespace

int main(int argc, char** argv) {
  zrpc::examples::cli::CommandLine args("greeter_client", kUsage);
  if (!args.Parse(argc, argv, {"connect", "name", "calls"})) return args.exit_code();
  const std::string* target = args.Find("connect");
  if (target == nullptr) return args.UsageError("--connect is required");
  if (!zrpc::examples::cli::IsTarget(*target)) return args.UsageError("bad --connect " + *target);
  HelloRequest request;
  request.set_name("world");
  if (const std::string* name = args.Find("name")) request.set_name(*name);
  uint64_t calls = 1;
  if (const std::string* text = args.Find("calls")) {
    std::optional<uint64_t> n = zrpc::examples::cli::ParseNumber(*text, 1, 1000000);
    if (!n) return args.UsageError("bad --calls " + *text);
    calls = *n;
  }

  // The channel connects on the first call; the device comes from ZRPC_RDMA_* (or is the
  // first active one).
  absl::StatusOr<std::unique_ptr<zrpc::ClientChannel>> channel =
      zrpc::CreateChannel(*target, zrpc::ChannelOptions{});
  if (!channel.ok()) {
    std::fprintf(stderr, "greeter_client: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  Greeter::Stub stub(channel->get());
  for (uint64_t i = 1; i <= calls; ++i) {
    HelloReply reply;
    absl::Status status = stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(kDeadline));
    if (!status.ok()) {
      std::fprintf(stderr, "greeter_client: call %llu of %llu: %s\n",
                   static_cast<unsigned long long>(i), static_cast<unsigned long long>(calls),
                   status.ToString().c_str());
      return 1;
    }
    std::printf("%s\n", reply.message().c_str());
  }
  std::printf("%llu calls ok\n", static_cast<unsigned long long>(calls));
  return 0;
}
