// Deadlines and keepalives across a step of the wall clock, on a real device (tag "rdma"). The
// test steps CLOCK_REALTIME of the machine it runs on, so it runs only inside tools/softroce's
// throw-away guest (as root, ZRPC_SOFTROCE_MODE=vm) and says SKIPPED anywhere else. Every wait
// here polls with absl::SleepFor (a relative sleep): a timed wait on the wall clock would itself
// be stretched by the step back.
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/skip.h"

namespace {

using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HelloRequest;
using zrpc::testing::Runtime;

// Moves the wall clock by `delta`; false when the process may not.
bool StepWallClock(absl::Duration delta) {
  timespec now{};
  if (clock_gettime(CLOCK_REALTIME, &now) != 0) return false;
  const timespec stepped = absl::ToTimespec(absl::TimeFromTimespec(now) + delta);
  return clock_settime(CLOCK_REALTIME, &stepped) == 0;
}

bool InThrowAwayGuest() {
  const char* mode = std::getenv("ZRPC_SOFTROCE_MODE");
  return geteuid() == 0 && mode != nullptr && std::strcmp(mode, "vm") == 0;
}

// Waits (relative sleeps only) until `done` or `limit` of steady time.
template <typename Done>
bool PollUntil(Done done, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Before: the client's timer compared absl::Now() with deadlines converted to the wall clock and
// slept in Abseil's timed waits, which end at an absolute wall-clock time. A step forward failed
// every call in flight with DEADLINE_EXCEEDED at once (and every keepalive); a step back held
// every deadline and keepalive by the step's length.
TEST_CASE("a wall clock stepped an hour forward or back neither fires nor holds deadlines") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  if (!InThrowAwayGuest()) {
    ZRPC_SKIP("steps the machine's wall clock: runs only in tools/softroce's throw-away guest");
  }
  Runtime rt(config);
  Greeter::Stub stub(rt.channel.get());
  // Connected first, so that the short deadline below meets the timer, not a slow connect.
  REQUIRE(rt.channel->Connect(absl::Now() + absl::Seconds(30)).ok());

  SECTION("forward: a call with 3 s left is not failed by it") {
    HelloRequest request;
    request.set_name("sleep:1500");
    HelloReply reply;
    std::atomic<bool> done{false};
    absl::Status status;
    stub.AsyncSayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(3)),
                       [&](absl::Status s) {
                         status = std::move(s);
                         done.store(true);
                       });
    absl::SleepFor(absl::Milliseconds(300));
    REQUIRE(StepWallClock(absl::Hours(1)));
    absl::SleepFor(absl::Milliseconds(500));
    const bool ended_during_step = done.load();
    REQUIRE(StepWallClock(-absl::Hours(1)));
    REQUIRE(PollUntil([&] { return done.load(); }, std::chrono::seconds(20)));
    INFO(status);
    CHECK_FALSE(ended_during_step);
    CHECK(status.ok());
    CHECK(reply.message() == "Hello, sleep:1500");
  }
  SECTION("back: a call's 300 ms deadline still fires after about 300 ms") {
    HelloRequest request;
    request.set_name("sleep:2000");
    HelloReply reply;
    std::atomic<bool> done{false};
    absl::Status status;
    const auto start = std::chrono::steady_clock::now();
    stub.AsyncSayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Milliseconds(300)),
                       [&](absl::Status s) {
                         status = std::move(s);
                         done.store(true);
                       });
    absl::SleepFor(absl::Milliseconds(50));
    REQUIRE(StepWallClock(-absl::Hours(1)));
    const bool ended = PollUntil([&] { return done.load(); }, std::chrono::seconds(10));
    const auto took = std::chrono::steady_clock::now() - start;
    REQUIRE(StepWallClock(absl::Hours(1)));
    REQUIRE(ended);
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(took < std::chrono::seconds(2));
  }
  // Keepalives were not fooled either way.
  CHECK(rt.channel->stats().connections_lost == 0);
}

}  // namespace
