// AdaptiveSpin on the host: the budget before any wait, its convergence to about twice a steady
// exchange's waits within the cap, no polling after a wait past the cap and back after one within
// it, the floor, and a cap of zero.
#include "transport/adaptive_spin.h"

#include <catch2/catch.hpp>

using zrpc::transport::AdaptiveSpin;

namespace {
constexpr int64_t kMicro = 1000;
constexpr int64_t kCap = 1000 * kMicro;  // 1 ms
}  // namespace

TEST_CASE("before any wait the budget is the cap", "[adaptive_spin]") {
  AdaptiveSpin spin;
  CHECK(spin.BudgetNanos(kCap) == kCap);
  CHECK(spin.estimate_ns() == -1);
  CHECK_FALSE(spin.sparse());
}

TEST_CASE("a steady exchange polls for about twice its waits", "[adaptive_spin]") {
  AdaptiveSpin spin;
  spin.Observe(200 * kMicro, kCap);
  CHECK(spin.BudgetNanos(kCap) == 400 * kMicro);  // the first wait is the estimate
  for (int i = 0; i < 50; ++i) spin.Observe(100 * kMicro, kCap);
  CHECK(spin.estimate_ns() >= 100 * kMicro);
  CHECK(spin.estimate_ns() <= 101 * kMicro);
  CHECK(spin.BudgetNanos(kCap) >= 200 * kMicro);
  CHECK(spin.BudgetNanos(kCap) <= 202 * kMicro);
  // One outlier within the cap moves it by a quarter of the difference, not to the outlier.
  spin.Observe(900 * kMicro, kCap);
  CHECK(spin.estimate_ns() < 310 * kMicro);
  // Never past the cap, however long the waits within it.
  for (int i = 0; i < 50; ++i) spin.Observe(kCap, kCap);
  CHECK(spin.BudgetNanos(kCap) == kCap);
  // A smaller cap on the next wait (another channel's) bounds it too.
  CHECK(spin.BudgetNanos(kCap / 10) == kCap / 10);
}

TEST_CASE("after a wait past the cap it sleeps at once, until a wait ends within the cap",
          "[adaptive_spin]") {
  AdaptiveSpin spin;
  for (int i = 0; i < 10; ++i) spin.Observe(100 * kMicro, kCap);
  const int64_t steady = spin.estimate_ns();
  spin.Observe(kCap + 1, kCap);  // one past the cap: sparse
  CHECK(spin.sparse());
  CHECK(spin.BudgetNanos(kCap) == 0);
  CHECK(spin.estimate_ns() == steady);     // kept for when the exchange is steady again
  spin.Observe(50 * 1000 * kMicro, kCap);  // idle: still sparse
  CHECK(spin.BudgetNanos(kCap) == 0);
  spin.Observe(kCap, kCap);  // at the cap: within it, polling resumes
  CHECK_FALSE(spin.sparse());
  CHECK(spin.BudgetNanos(kCap) > 0);
}

TEST_CASE("the budget has a floor, and a cap of zero never polls", "[adaptive_spin]") {
  AdaptiveSpin spin;
  for (int i = 0; i < 10; ++i) spin.Observe(0, kCap);
  CHECK(spin.BudgetNanos(kCap) == AdaptiveSpin::kFloorNanos);
  CHECK(spin.BudgetNanos(AdaptiveSpin::kFloorNanos / 2) == AdaptiveSpin::kFloorNanos / 2);
  spin.Observe(-5, kCap);  // a clock that stepped back counts as no wait
  CHECK(spin.estimate_ns() >= 0);
  AdaptiveSpin never;
  CHECK(never.BudgetNanos(0) == 0);
  never.Observe(10 * kMicro, 0);  // past a cap of zero: sparse, and zero anyway
  CHECK(never.BudgetNanos(0) == 0);
}

// Before the probe: an exchange a little shorter than the cap, once a wait had slept, measured
// longer than the cap (the wake-up added) on every wait after, and never polled again.
TEST_CASE("a sparse run polls for the whole cap every kProbeInterval-th wait, to see",
          "[adaptive_spin]") {
  AdaptiveSpin spin;
  int probes = 0;
  for (uint32_t i = 0; i < 3 * AdaptiveSpin::kProbeInterval; ++i) {
    spin.Observe(kCap + 100 * kMicro, kCap);  // slept: the exchange plus a wake-up
    const int64_t budget = spin.BudgetNanos(kCap);
    CHECK((budget == 0 || budget == kCap));
    probes += budget == kCap;
  }
  CHECK(probes == 3);
  // A probe that catches the event within the cap ends the sparse run.
  spin.Observe(kCap - 100 * kMicro, kCap);
  CHECK_FALSE(spin.sparse());
  CHECK(spin.BudgetNanos(kCap) == kCap);  // twice the 900 us estimate, capped
}
