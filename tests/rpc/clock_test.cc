// The runtime's monotonic time (rpc/common/monotonic.h) and the handler's view of a deadline, on
// the host: a step of the wall clock moves neither.
#include "absl/time/clock.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "absl/time/time.h"
#include "rpc/common/monotonic.h"
#include "rpc/generated_api.h"

namespace {

using zrpc::internal::MonotonicNow;
using zrpc::internal::ToMonotonic;

TEST_CASE("a wall-clock deadline becomes a monotonic one at the same distance", "[clock]") {
  const absl::Time wall_now = absl::FromUnixSeconds(1'800'000'000);
  const absl::Time mono_now = absl::FromUnixSeconds(1'000);
  CHECK(ToMonotonic(wall_now + absl::Seconds(3), mono_now, wall_now) ==
        mono_now + absl::Seconds(3));
  CHECK(ToMonotonic(wall_now - absl::Seconds(3), mono_now, wall_now) ==
        mono_now - absl::Seconds(3));  // already passed: still passed
  CHECK(ToMonotonic(absl::InfiniteFuture(), mono_now, wall_now) == absl::InfiniteFuture());
}

TEST_CASE("the monotonic clock never goes back", "[clock]") {
  absl::Time last = MonotonicNow();
  for (int i = 0; i < 100000; ++i) {
    const absl::Time now = MonotonicNow();
    REQUIRE(now >= last);
    last = now;
  }
}

// Before: IsCancelled compared absl::Now() with the deadline, so a wall clock stepped forward by
// an hour (NTP, a VM resumed) gave up every call at once, and one stepped back kept them alive
// an hour too long. The context keeps the deadline on the monotonic clock only; the wall-clock
// deadline() is worked out from it when asked.
TEST_CASE("a handler's call is given up by its monotonic deadline, whatever the wall clock does",
          "[clock]") {
  zrpc::ServerContext context;
  context.SetRemaining(absl::Hours(1));
  CHECK(context.deadline() > absl::Now() + absl::Minutes(59));
  CHECK(context.deadline() < absl::Now() + absl::Minutes(61));
  CHECK(context.remaining() > absl::Minutes(59));
  CHECK_FALSE(context.IsCancelled());

  zrpc::ServerContext short_one;
  short_one.SetRemaining(absl::Milliseconds(20));
  CHECK_FALSE(short_one.IsCancelled());
  absl::SleepFor(absl::Milliseconds(40));
  CHECK(short_one.IsCancelled());
  CHECK(short_one.remaining() == absl::ZeroDuration());
  CHECK(short_one.deadline() <= absl::Now());

  // Counted from the request's arrival, as the runtime reads it (no second clock read): a call
  // that arrived 50 ms ago with 20 ms left is given up already; one with 1 s left is not.
  const auto arrived = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  zrpc::ServerContext late;
  late.SetRemaining(absl::Milliseconds(20), arrived);
  CHECK(late.IsCancelled());
  zrpc::ServerContext in_time;
  in_time.SetRemaining(absl::Seconds(1), arrived);
  CHECK_FALSE(in_time.IsCancelled());
  CHECK(in_time.remaining() <= absl::Milliseconds(950));

  zrpc::ServerContext none;
  none.SetRemaining(absl::InfiniteDuration());
  CHECK(none.deadline() == absl::InfiniteFuture());
  CHECK(none.remaining() == absl::InfiniteDuration());
  CHECK_FALSE(none.IsCancelled());
  none.Cancel();
  CHECK(none.IsCancelled());

  zrpc::ServerContext unset;  // as a test of a handler might make it
  CHECK(unset.deadline() == absl::InfiniteFuture());
  CHECK_FALSE(unset.IsCancelled());
}

}  // namespace
