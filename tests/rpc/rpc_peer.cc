// The other process of the cross-process runtime tests (cross_process_test.cc).
//
//   rpc_peer server PORT            serves Greeter on PORT (0: any); prints "listening PORT"
//   rpc_peer client ADDR:PORT N     keeps N SayHello("sleep:300") calls in flight forever;
//                                   prints "calling" once the first call is in flight
//
// Both run until killed; that is the point.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/rpc/sleepy_greeter.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

int Server(uint16_t port) {
  zrpc::testing::SleepyGreeter greeter;
  zrpc::ServerOptions options;
  options.port = port;
  options.handler_threads = 16;
  auto server = zrpc::Server::Create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", server.status().ToString().c_str());
    return 1;
  }
  if (absl::Status s = (*server)->AddService(&greeter); !s.ok()) return 1;
  if (absl::Status s = (*server)->Start(); !s.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("listening %u\n", (*server)->port());
  std::fflush(stdout);
  for (;;) absl::SleepFor(absl::Hours(1));
}

int Client(const std::string& target, int in_flight) {
  auto channel = zrpc::CreateChannel(target, zrpc::ChannelOptions{});
  if (!channel.ok()) {
    std::fprintf(stderr, "rpc_peer: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  Greeter::Stub stub(channel->get());
  struct Window {
    absl::Mutex mu;
    int outstanding = 0;
    int limit = 0;
  } window;
  window.limit = in_flight;
  HelloRequest request;
  request.set_name("sleep:300");
  for (bool announced = false;;) {
    {
      absl::MutexLock lock(&window.mu);
      if (!announced && window.outstanding == window.limit) {
        std::printf("calling\n");
        std::fflush(stdout);
        announced = true;
      }
      window.mu.Await(absl::Condition(
          +[](Window* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->outstanding < w->limit; },
          &window));
      ++window.outstanding;
    }
    auto* reply = new HelloReply;
    stub.AsyncSayHello(request, reply, zrpc::CallOptions::Timeout(absl::Seconds(60)),
                       [&window, reply](absl::Status) {
                         delete reply;
                         absl::MutexLock lock(&window.mu);
                         --window.outstanding;
                       });
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  uint32_t number = 0;
  if (mode == "server" && argc == 3 && absl::SimpleAtoi(argv[2], &number) && number < 65536) {
    return Server(static_cast<uint16_t>(number));
  }
  if (mode == "client" && argc == 4 && absl::SimpleAtoi(argv[3], &number) && number > 0) {
    return Client(argv[2], static_cast<int>(number));
  }
  std::fprintf(stderr, "usage: rpc_peer server PORT | rpc_peer client ADDR:PORT IN_FLIGHT\n");
  return 2;
}
