// CallWaiter: the blocking call's wait, on the host (no device). Each path the waiter can take --
// done before the wait, done while it polls, done after it went to sleep -- returns exactly once
// the notifier's writes are visible.
#include "rpc/impl/call_waiter.h"

#include <time.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>

namespace zrpc::internal {
namespace {

using std::chrono::microseconds;

int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

using std::chrono::milliseconds;

TEST_CASE("a call done before the wait returns at once, spinning or not") {
  for (microseconds spin : {microseconds(0), microseconds(50)}) {
    CallWaiter waiter;
    waiter.Notify();
    waiter.Wait(spin);
    CHECK(waiter.done());
  }
}

TEST_CASE("a waiter past its spin sleeps, and the notifier wakes it with its writes visible") {
  for (microseconds spin : {microseconds(0), microseconds(200)}) {
    CallWaiter waiter;
    int result = 0;
    const auto start = std::chrono::steady_clock::now();
    std::thread notifier([&] {
      std::this_thread::sleep_for(milliseconds(50));  // well past the spin: the waiter sleeps
      result = 42;
      waiter.Notify();
    });
    const int64_t cpu_before = ThreadCpuNanos();
    waiter.Wait(spin);
    const int64_t cpu = ThreadCpuNanos() - cpu_before;
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(result == 42);
    CHECK(waited >= milliseconds(50));
    // It slept rather than polled through the 50 ms: its own CPU time is the spin and a little.
    INFO("the waiter's CPU time: " << cpu << " ns");
    CHECK(cpu < 20'000'000);
    notifier.join();
  }
}

// Many short calls, each waiter on the heap and freed the moment Wait returns (as a stack
// waiter is), notified from another thread at every distance from the spin's end: under ASan
// this checks that Notify touches nothing after the waiter may be gone; everywhere, that no
// wake-up is lost (a lost one hangs the test).
TEST_CASE("waiters freed as soon as they return, notified around the end of their spin") {
  constexpr int kCalls = 20000;
  std::atomic<CallWaiter*> current{nullptr};
  std::atomic<int> values{0};
  std::thread notifier([&] {
    for (int i = 0; i < kCalls; ++i) {
      CallWaiter* waiter;
      while ((waiter = current.exchange(nullptr, std::memory_order_acq_rel)) == nullptr) {
      }
      // Spread the notify over [0, ~40 us): before, during and after the waiter's 10 us spin.
      const auto until = std::chrono::steady_clock::now() + microseconds(i % 40);
      while (std::chrono::steady_clock::now() < until) {
      }
      values.fetch_add(1, std::memory_order_relaxed);
      waiter->Notify();
    }
  });
  for (int i = 0; i < kCalls; ++i) {
    auto waiter = std::make_unique<CallWaiter>();
    current.store(waiter.get(), std::memory_order_release);
    waiter->Wait(microseconds(10));
    REQUIRE(values.load(std::memory_order_relaxed) == i + 1);
  }
  notifier.join();
}

}  // namespace
}  // namespace zrpc::internal
