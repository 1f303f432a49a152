// When a call's time starts and what it is counted on, through the whole runtime on the host:
// the server and channel of runtime_fixture.h over fakeverbs (tests/fakeverbs), with their
// poller threads, so this runs in the host phase and under ASan, no device needed. And the call
// clock itself (rpc/common/call_clock.h): one reading per batch or call start.
#include <catch2/catch.hpp>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/common/call_clock.h"
#include "rpc/common/monotonic.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::fakeverbs::FakeDevice;

using zrpc::CallOptions;
using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HelloRequest;
using zrpc::testing::Named;
using zrpc::testing::Runtime;

// Before: CallOptions::Timeout read the wall clock when the options were made, so options kept
// for later calls (a member, a constant) carried a deadline that had passed, and every call
// after the first timeout's length failed at once without being sent.
TEST_CASE("one CallOptions::Timeout serves calls made after its length has passed, each whole",
          "[call_timing]") {
  Runtime rt(FakeDevice());
  Greeter::Stub stub(rt.channel.get());
  const CallOptions options = CallOptions::Timeout(absl::Milliseconds(300));
  HelloReply reply;
  REQUIRE(stub.SayHello(Named("first"), &reply, options).ok());
  absl::SleepFor(absl::Milliseconds(400));
  const absl::Status second = stub.SayHello(Named("second"), &reply, options);
  INFO(second);
  CHECK(second.ok());
  CHECK(reply.message() == "Hello, second");
  // The whole timeout again: a handler taking 200 ms of it still answers in time, and the
  // handler was told about 300 ms.
  const absl::Time before = absl::Now();
  REQUIRE(stub.SayHello(Named("sleep:200"), &reply, options).ok());
  const absl::Time seen = rt.greeter.last_deadline();
  CHECK(seen > before + absl::Milliseconds(250));
  CHECK(seen <= absl::Now() + absl::Milliseconds(300));
}

TEST_CASE("a timeout and a deadline set together: whichever ends first applies", "[call_timing]") {
  Runtime rt(FakeDevice());
  Greeter::Stub stub(rt.channel.get());
  HelloReply reply;
  CallOptions timeout_first;
  timeout_first.timeout = absl::Milliseconds(50);
  timeout_first.deadline = absl::Now() + absl::Hours(1);
  CHECK(stub.SayHello(Named("sleep:400"), &reply, timeout_first).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CallOptions deadline_first;
  deadline_first.timeout = absl::Hours(1);
  deadline_first.deadline = absl::Now() + absl::Milliseconds(50);
  CHECK(stub.SayHello(Named("sleep:400"), &reply, deadline_first).code() ==
        absl::StatusCode::kDeadlineExceeded);
  // Neither passed: the call is answered, and the handler sees the earlier one.
  CallOptions both;
  both.timeout = absl::Seconds(20);
  both.deadline = absl::Now() + absl::Seconds(40);
  const absl::Time before = absl::Now();
  REQUIRE(stub.SayHello(Named("both"), &reply, both).ok());
  CHECK(rt.greeter.last_deadline() > before + absl::Seconds(19));
  CHECK(rt.greeter.last_deadline() <= absl::Now() + absl::Seconds(20));
  // A timeout of zero or less has passed when the call starts: nothing is sent.
  const int hellos = rt.greeter.hellos.load();
  CHECK(stub.SayHello(Named("none"), &reply, CallOptions::Timeout(absl::ZeroDuration())).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(stub.SayHello(Named("none"), &reply, CallOptions::Timeout(-absl::Seconds(1))).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(rt.greeter.hellos.load() == hellos);
}

TEST_CASE("the call clock: one reading per scope, a refresh moves it, none outside",
          "[call_timing]") {
  using zrpc::internal::CallClockNow;
  using zrpc::internal::CallClockRefresh;
  using zrpc::internal::CallClockScope;
  using zrpc::internal::MonotonicNow;
  // Outside a scope or batch every call reads.
  const absl::Time a = CallClockNow();
  absl::SleepFor(absl::Milliseconds(2));
  CHECK(CallClockNow() > a);
  {
    const int64_t seed_nanos = zrpc::internal::MonotonicNanos() - 5'000'000'000;
    const absl::Time seed = absl::FromUnixNanos(seed_nanos);
    CHECK(seed < MonotonicNow());  // the same clock, as absl::Time
    CallClockScope scope(seed_nanos);
    CHECK(CallClockNow() == seed);
    CHECK(zrpc::internal::CallClockNanos() == seed_nanos);
    {
      CallClockScope inner(seed_nanos + 3'600'000'000'000);  // the outer reading stays
      CHECK(CallClockNow() == seed);
    }
    CHECK(CallClockNow() == seed);
    const absl::Time fresh = CallClockRefresh();
    CHECK(fresh > seed + absl::Seconds(4));
    CHECK(CallClockNow() == fresh);
  }
  const absl::Time after = CallClockNow();
  absl::SleepFor(absl::Milliseconds(2));
  CHECK(CallClockNow() > after);
}

}  // namespace

// A blocking caller's spin (call_interfaces.h, BlockingWait; transport/adaptive_spin.h): the cap
// before it has waited, about twice its answers' time after quick ones, nothing after an answer
// slower than the cap, and back once answers are quick again. Per thread.
TEST_CASE("a blocking caller polls for about twice its recent answers' time, up to the spin",
          "[call_timing]") {
  zrpc::ChannelOptions options;
  options.spin = absl::Milliseconds(100);
  Runtime rt(FakeDevice(), {}, options);
  Greeter::Stub stub(rt.channel.get());
  zrpc::Channel* channel = rt.channel.get();
  using zrpc::internal::ChannelAccess;
  const std::chrono::nanoseconds cap = std::chrono::milliseconds(100);
  auto budget = [&] { return ChannelAccess::blocking_wait(channel).spin; };
  std::thread([&] {
    // A thread that has not waited yet polls for the whole spin.
    CHECK(budget() == cap);
    CHECK(ChannelAccess::blocking_wait(channel).cap == cap);
  }).join();
  HelloReply reply;
  for (int i = 0; i < 20; ++i) REQUIRE(stub.SayHello(Named("quick"), &reply).ok());
  INFO("after quick calls: " << budget().count() << " ns");
  CHECK(budget() > std::chrono::nanoseconds(0));
  CHECK(budget() < cap);
  // Slower than the cap: the next call sleeps at once.
  REQUIRE(stub.SayHello(Named("sleep:150"), &reply).ok());
  CHECK(budget() == std::chrono::nanoseconds(0));
  // Within the cap again (sleeping included): polling is back.
  REQUIRE(stub.SayHello(Named("quick"), &reply).ok());
  CHECK(budget() > std::chrono::nanoseconds(0));
  // A spin of zero never polls and learns nothing.
  zrpc::ChannelOptions no_spin;
  no_spin.spin = absl::ZeroDuration();
  Runtime zero(FakeDevice(), {}, no_spin);
  const zrpc::internal::BlockingWait wait = ChannelAccess::blocking_wait(zero.channel.get());
  CHECK(wait.spin == std::chrono::nanoseconds(0));
  CHECK(wait.learn == nullptr);
}
