// The runtime under load, on a real device (tag "rdma"): full windows, slow handlers, callbacks
// that call again. Each case once failed: the comment above it says how.
#include <catch2/catch.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HelloRequest;
using zrpc::testing::kLong;
using zrpc::testing::Runtime;
using zrpc::testing::Within;

// Holds every call it gets until Release(), then finishes them all from its own thread: an
// AsyncService whose calls wait on something slow (a long poll, a disk).
class HoldingGreeter : public Greeter::AsyncService {
 public:
  using Pending = zrpc::PendingCall<HelloRequest, HelloReply>;
  ~HoldingGreeter() override { Release(); }

  void SayHello(std::unique_ptr<Pending> call) override {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::move(call));
  }
  void Ping(std::unique_ptr<zrpc::PendingCall<google::protobuf::Empty, google::protobuf::Empty>>
                call) override {
    call->Finish(absl::OkStatus());
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  void Release() {
    std::deque<std::unique_ptr<Pending>> calls;
    {
      absl::MutexLock lock(&mu_);
      calls.swap(held_);
    }
    for (auto& call : calls) {
      call->response()->set_message("Hello, " + call->request().name());
      call->Finish(absl::OkStatus());
    }
  }

 private:
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Pending>> held_;
};

zrpc::ChannelOptions FastKeepalives() {
  zrpc::ChannelOptions options;
  options.keepalive_interval = absl::Milliseconds(100);
  options.keepalive_timeout = absl::Milliseconds(200);
  return options;
}

// Before: the ping was an ordinary SEND that waited for credits behind the calls the server
// held, went unanswered, and closed the connection after interval + timeout: every call failed
// UNAVAILABLE ("keepalive: no answer from the server within ... credits available 1 of 32").
TEST_CASE("a server holding a window's worth of slow calls for many keepalive timeouts is not "
          "declared dead (blocking handlers)") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.handler_threads = 40;  // enough for every call: the window is the limit
  Runtime rt(config, server_options, FastKeepalives());
  Greeter::Stub stub(rt.channel.get());
  constexpr int kCalls = 36;  // more than the 32 receives a connection gives the server
  std::vector<HelloRequest> requests(kCalls);
  std::vector<HelloReply> replies(kCalls);
  std::vector<absl::Status> statuses(kCalls);
  std::atomic<int> done{0};
  absl::Notification all_done;
  for (int i = 0; i < kCalls; ++i) {
    requests[i].set_name("sleep:1500");  // 7 keepalive timeouts
    stub.AsyncSayHello(requests[i], &replies[i], Within(kLong), [&, i](absl::Status s) {
      statuses[i] = std::move(s);
      if (done.fetch_add(1) + 1 == kCalls) all_done.Notify();
    });
  }
  REQUIRE(all_done.WaitForNotificationWithTimeout(kLong));
  for (int i = 0; i < kCalls; ++i) {
    INFO("call " << i << ": " << statuses[i]);
    CHECK(statuses[i].ok());
    CHECK(replies[i].message() == "Hello, sleep:1500");
  }
  CHECK(rt.channel->stats().connections_lost == 0);
}

TEST_CASE("a server holding a window's worth of calls for many keepalive timeouts is not "
          "declared dead (AsyncService)") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  HoldingGreeter greeter;
  zrpc::ServerOptions server_options;
  server_options.device = config;
  auto server = zrpc::Server::Create(server_options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&greeter).ok());
  REQUIRE((*server)->Start().ok());
  zrpc::ChannelOptions channel_options = FastKeepalives();
  channel_options.device = config;
  auto channel = zrpc::CreateChannel(absl::StrCat(config.addr, ":", (*server)->port()),
                                     channel_options);
  REQUIRE(channel.ok());
  Greeter::Stub stub(channel->get());

  constexpr int kCalls = 40;
  std::vector<HelloRequest> requests(kCalls);
  std::vector<HelloReply> replies(kCalls);
  std::vector<absl::Status> statuses(kCalls);
  std::atomic<int> done{0};
  absl::Notification all_done;
  for (int i = 0; i < kCalls; ++i) {
    requests[i].set_name(absl::StrCat("held ", i));
    stub.AsyncSayHello(requests[i], &replies[i], Within(kLong), [&, i](absl::Status s) {
      statuses[i] = std::move(s);
      if (done.fetch_add(1) + 1 == kCalls) all_done.Notify();
    });
  }
  // The server holds as many as the window lets through; the rest wait on this side.
  const absl::Time until = absl::Now() + kLong;
  while (greeter.held() < 30 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(greeter.held() >= 30);
  absl::SleepFor(absl::Milliseconds(1500));  // 7 keepalive timeouts
  CHECK_FALSE(all_done.HasBeenNotified());
  CHECK((*channel)->stats().connections_lost == 0);
  // Answer everything, including the calls that arrive as the window frees.
  while (!all_done.HasBeenNotified() && absl::Now() < until) {
    greeter.Release();
    absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE(all_done.HasBeenNotified());
  for (int i = 0; i < kCalls; ++i) {
    INFO("call " << i << ": " << statuses[i]);
    CHECK(statuses[i].ok());
    CHECK(replies[i].message() == absl::StrCat("Hello, held ", i));
  }
  CHECK((*channel)->stats().connections_lost == 0);
  channel->reset();
  (*server)->Shutdown(absl::Seconds(1));
}

// Starts SayHello("sleep:50") and, from its callback, two more, until `depth` levels: a client
// that pipelines its work from completion callbacks.
struct CallTree {
  CallTree(Greeter::Stub* s, int d) : stub(s), depth(d) {}
  Greeter::Stub* stub;
  int depth;
  std::atomic<int> started{0};
  std::atomic<int> ok{0};
  std::atomic<int> refused_on_runtime_thread{0};
  std::atomic<int> other{0};
  absl::Mutex mu;
  std::vector<std::string> unexpected;

  void Start(int level) {
    started.fetch_add(1);
    auto request = std::make_shared<HelloRequest>();
    auto reply = std::make_shared<HelloReply>();
    request->set_name("sleep:50");
    stub->AsyncSayHello(*request, reply.get(), Within(absl::Seconds(20)),
                        [this, level, request, reply](absl::Status s) {
                          if (s.ok()) {
                            ok.fetch_add(1);
                          } else if (s.code() == absl::StatusCode::kResourceExhausted &&
                                     absl::StrContains(s.message(), "runtime thread")) {
                            refused_on_runtime_thread.fetch_add(1);
                          } else {
                            other.fetch_add(1);
                            absl::MutexLock lock(&mu);
                            unexpected.push_back(s.ToString());
                          }
                          if (level + 1 < depth) {
                            Start(level + 1);
                            Start(level + 1);
                          }
                          ended.fetch_add(1);
                        });
  }
  std::atomic<int> ended{0};
};

// Before: AcquireSendSlot waited for a slot until the call's deadline, on the poller thread the
// callback ran on, which is the only thread that frees slots: the poller (and every connection
// on it) stopped until the deadline, forever with none.
TEST_CASE("callbacks that each start two more calls with few send slots never block their "
          "poller: a call that cannot get a slot there fails at once, saying why") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.listener.connection.recv_credits = 4;  // two requests in flight, the rest wait
  zrpc::ChannelOptions channel_options;
  channel_options.connection.max_send_slots = 4;  // ... holding a slot each, four at most
  Runtime rt(config, server_options, channel_options);
  Greeter::Stub stub(rt.channel.get());
  CallTree tree(&stub, 5);  // 1 + 2 + 4 + 8 + 16 calls
  tree.Start(0);
  constexpr int kCalls = 31;
  // Deadlines are 20 s: a poller blocked until them would miss this by far.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (tree.ended.load() < kCalls && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  INFO("ok " << tree.ok.load() << ", refused " << tree.refused_on_runtime_thread.load()
             << ", other " << tree.other.load());
  REQUIRE(tree.ended.load() == kCalls);
  CHECK(tree.started.load() == kCalls);
  for (const std::string& s : tree.unexpected) FAIL_CHECK(s);
  CHECK(tree.ok.load() + tree.refused_on_runtime_thread.load() == kCalls);
  CHECK(tree.ok.load() >= 3);  // the root and its first children at least
  CHECK(tree.refused_on_runtime_thread.load() > 0);  // the case under test did happen
  // The poller is free: an ordinary blocking call goes through.
  HelloRequest request;
  request.set_name("after");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply, Within(kLong)).ok());
}

}  // namespace
