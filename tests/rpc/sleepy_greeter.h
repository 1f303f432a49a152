// A Greeter for runtime tests: SayHello("sleep:N") sleeps N ms (stopping early when the call is
// cancelled) before answering "Hello, <name>"; it counts the calls it saw cancelled.
#ifndef ZRPC_TESTS_RPC_SLEEPY_GREETER_H_
#define ZRPC_TESTS_RPC_SLEEPY_GREETER_H_

#include <atomic>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"

namespace zrpc::testing {

class SleepyGreeter : public examples::Greeter::Service {
 public:
  absl::Status SayHello(ServerContext& context, const examples::HelloRequest& request,
                        examples::HelloReply* reply) override {
    const std::string& name = request.name();
    int ms = 0;
    if (name.rfind("sleep:", 0) == 0 && absl::SimpleAtoi(name.substr(6), &ms)) {
      absl::Time until = absl::Now() + absl::Milliseconds(ms);
      while (absl::Now() < until && !context.IsCancelled()) absl::SleepFor(absl::Milliseconds(1));
      if (context.IsCancelled()) cancelled.fetch_add(1);
    }
    reply->set_message("Hello, " + name);
    return absl::OkStatus();
  }

  std::atomic<int> cancelled{0};
};

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_RPC_SLEEPY_GREETER_H_
