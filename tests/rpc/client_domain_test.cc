// A client's calls live in their transport connection's domain (rpc/client/client_connection.h):
// a call started on an application thread while the poller holds the domain (a done-callback
// still running) is left there and goes when the poller lets go, the starting thread never
// waiting; a stream's frames never overtake its opening left that way; a call that fails inside
// the domain on an application thread runs its callback after that thread lets go, so the
// callback may make a blocking call on the same connection. Over fakeverbs with the pollers on
// their own threads: on the host and under ASan.
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/examples/numbers.zrpc.h"
#include "tests/eventually.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/rpc/numbers_fixture.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::CallOptions;
using zrpc::fakeverbs::FakeDevice;
using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HoldingGreeter;
using zrpc::testing::Named;
using zrpc::testing::Served;

// One connection, so every call below shares one domain.
zrpc::ChannelOptions OneConnection() {
  zrpc::ChannelOptions options;
  options.connections = 1;
  return options;
}

// An asynchronous Ping whose callback holds the client's poller (and with it the connection's
// domain) until `go`.
struct HeldCallback {
  absl::Notification in_callback, go, returned;
  absl::Status status;
  google::protobuf::Empty request, reply;

  void Start(Greeter::Stub& stub) {
    stub.AsyncPing(request, &reply, CallOptions::Timeout(absl::Seconds(30)),
                   [this](absl::Status s) {
                     status = std::move(s);
                     in_callback.Notify();
                     go.WaitForNotification();
                     returned.Notify();
                   });
    REQUIRE(in_callback.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
};

}  // namespace

TEST_CASE(
    "a call started while a callback holds the connection's domain is left there, and goes when "
    "the callback returns",
    "[client_domain]") {
  HoldingGreeter greeter;
  Served served(FakeDevice(), {&greeter}, {}, OneConnection());
  Greeter::Stub stub(served.channel.get());
  google::protobuf::Empty request, reply;
  REQUIRE(stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(30))).ok());  // connected
  HeldCallback held;
  held.Start(stub);
  CHECK(held.status.ok());
  // The poller is in its batch, in the callback: these return at once (a start that waited for
  // the domain would never return, the callback waiting for this thread).
  constexpr int kCalls = 8;
  std::atomic<int> ok{0}, ended{0};
  std::vector<google::protobuf::Empty> replies(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    stub.AsyncPing(request, &replies[i], CallOptions::Timeout(absl::Seconds(30)),
                   [&](absl::Status s) {
                     ok += s.ok() ? 1 : 0;
                     ++ended;
                   });
  }
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(ended.load() == 0);  // not sent yet: the domain is held
  CHECK(served.channel->stats().calls_in_flight <= 1);
  held.go.Notify();
  REQUIRE(held.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(zrpc::testing::Eventually([&] { return ended.load() == kCalls; }));
  CHECK(ok.load() == kCalls);
  CHECK(zrpc::testing::Eventually([&] { return served.channel->stats().calls_in_flight == 0; }));
}

TEST_CASE(
    "a call refused inside the domain on an application thread runs its callback after the "
    "thread lets go: a blocking call made there succeeds",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc::ChannelOptions options = OneConnection();
  options.max_calls_per_connection = 2;
  // Nothing of the runtime's own on the connection (pings), so that the poller is idle, the
  // domain free, when the third call starts: it runs on this thread.
  options.keepalive_interval = absl::ZeroDuration();
  Served served(FakeDevice(), {&greeter}, {}, options);
  Greeter::Stub stub(served.channel.get());
  HelloReply first, second, third;
  std::atomic<int> held_ok{0};
  auto count = [&](absl::Status s) { held_ok += s.ok() ? 1 : 0; };
  stub.AsyncSayHello(Named("a"), &first, CallOptions::Timeout(absl::Seconds(30)), count);
  stub.AsyncSayHello(Named("b"), &second, CallOptions::Timeout(absl::Seconds(30)), count);
  REQUIRE(zrpc::testing::Eventually([&] { return greeter.held() == 2; }));
  absl::SleepFor(absl::Milliseconds(50));  // the sends' completions handled
  // The table is full: this one is refused in the domain, on this thread (the domain is free).
  absl::Status refused, inner;
  bool answered = false;
  absl::Notification done;
  stub.AsyncSayHello(
      Named("c"), &third, CallOptions::Timeout(absl::Seconds(30)), [&](absl::Status s) {
        refused = std::move(s);
        // The held calls answered: their answers come through the domain, which
        // this thread must not hold any more; then a blocking call on the same
        // connection.
        greeter.Release();
        answered =
            zrpc::testing::Eventually([&] { return held_ok.load() == 2; }, absl::Seconds(10));
        google::protobuf::Empty request, reply;
        inner = stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(10)));
        done.Notify();
      });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(answered);
  INFO(inner);
  CHECK(inner.ok());
}

TEST_CASE(
    "a stream opened while the domain is held sends its half-close after its opening, never "
    "before",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc_test::TestNumbers numbers;
  Served served(FakeDevice(), {&greeter, &numbers}, {}, OneConnection());
  Greeter::Stub greeter_stub(served.channel.get());
  zrpc::examples::Numbers::Stub numbers_stub(served.channel.get());
  google::protobuf::Empty request, reply;
  REQUIRE(greeter_stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(30))).ok());
  HeldCallback held;
  held.Start(greeter_stub);
  zrpc::examples::Total total;
  // Opened now, its start left in the domain. The half-close needs no credit from the server
  // (a message would wait for one, which only the opening brings): it waits here for the opening
  // to go, which happens when the callback lets go, a moment later. Sent first, it would reach
  // the server for a call it does not know.
  zrpc::ClientWriter<zrpc::examples::Number> writer =
      numbers_stub.Sum(&total, CallOptions::Timeout(absl::Seconds(30)));
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(100));
    held.go.Notify();
  });
  CHECK(writer.WritesDone());
  const absl::Status status = writer.Finish();
  release.join();
  INFO(status);
  CHECK(status.ok());
  CHECK(total.count() == 0);
  // And the connection is sound: a stream of 100 numbers after it.
  zrpc::ClientWriter<zrpc::examples::Number> more =
      numbers_stub.Sum(&total, CallOptions::Timeout(absl::Seconds(30)));
  zrpc::examples::Number number;
  constexpr uint64_t kCount = 100;
  for (uint64_t i = 1; i <= kCount; ++i) {
    number.set_value(i);
    REQUIRE(more.Write(number));
  }
  CHECK(more.WritesDone());
  CHECK(more.Finish().ok());
  CHECK(total.count() == kCount);
  CHECK(total.sum() == kCount * (kCount + 1) / 2);
}
