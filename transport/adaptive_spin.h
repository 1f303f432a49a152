// AdaptiveSpin: how long a thread that waits for an event (a poller for its next completion, a
// blocking caller for its answer) polls before it sleeps, learned from how long its past waits
// took.
//
// Sleeping costs a wake-up (an interrupt, a futex or poll(2) return, a context switch: several
// microseconds on hardware, more than an RDMA round trip), and polling costs a core while it
// lasts. A fixed spin is wrong both ways: too short for a slow fabric or handler, every wait
// sleeps anyway after wasting the spin; too long for sparse traffic, every wait burns the whole
// spin and sleeps anyway. So the budget follows the waits this thread saw:
//  - while its waits end within `cap` (the user's `spin` option), it polls for about twice their
//    smoothed length (at least kFloorNanos, at most `cap`): the next event of a steady exchange
//    is caught by polling, with room for jitter;
//  - after a wait longer than `cap` (traffic sparser than the cap, or idle), it does not poll at
//    all: the next wait sleeps at once and costs no CPU. The first wait that ends within `cap`
//    again turns polling back on. A wait that slept is longer by the wake-up, so an exchange
//    slightly shorter than the cap would look longer for ever; every kProbeInterval-th wait of
//    a sparse run therefore polls for the whole cap again, to see;
//  - before it has seen any wait it polls for `cap`, as a fixed spin did.
// A cap of zero never polls. eRPC and UCX poll in the same spirit (their callers busy-poll a
// bounded time); brpc grew a polling mode for the same reason (rdma-pitfalls.md).
//
// Not thread-safe: one per waiting thread (a poller's loop holds one; blocking callers each have
// a thread-local one: rpc/client/channel.cc).
#ifndef ZRPC_TRANSPORT_ADAPTIVE_SPIN_H_
#define ZRPC_TRANSPORT_ADAPTIVE_SPIN_H_

#include <time.h>

#include <algorithm>
#include <cstdint>

namespace zrpc::transport {

// The monotonic clock in nanoseconds, which the waiting threads time their waits with.
inline int64_t SpinClockNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// One pause in a polling loop: lets a sibling hyperthread run and saves power.
inline void SpinPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class AdaptiveSpin {
 public:
  // The least a budget ever is while polling is on: a clock read and a few polls.
  static constexpr int64_t kFloorNanos = 1000;
  // In a run of waits past the cap, every this many-th polls for the cap: a sparse run costs an
  // eighth of what a fixed spin would.
  static constexpr uint32_t kProbeInterval = 8;

  // How long to poll before sleeping, in [0, cap_ns].
  int64_t BudgetNanos(int64_t cap_ns) const {
    if (cap_ns <= 0) return 0;
    if (sparse_run_ > 0) return sparse_run_ % kProbeInterval == 0 ? cap_ns : 0;
    if (estimate_ns_ < 0) return cap_ns;
    return std::min(cap_ns, std::max(2 * estimate_ns_, kFloorNanos));
  }

  // A wait ended `waited_ns` after it began (sleeping included, if it slept).
  void Observe(int64_t waited_ns, int64_t cap_ns) {
    if (waited_ns > cap_ns) {
      ++sparse_run_;  // the estimate stays: it is what the exchange took when it was steady
      return;
    }
    sparse_run_ = 0;
    waited_ns = std::max<int64_t>(waited_ns, 0);
    // An exponential average weighing the latest wait by 1/4: a few waits move it, one outlier
    // does not double it.
    estimate_ns_ = estimate_ns_ < 0 ? waited_ns : estimate_ns_ + (waited_ns - estimate_ns_) / 4;
  }

  // The smoothed length of the waits that ended within the cap; -1 before the first.
  int64_t estimate_ns() const { return estimate_ns_; }
  // Whether the last wait took longer than the cap (polling is off, but for the probes, until
  // one does not).
  bool sparse() const { return sparse_run_ > 0; }

 private:
  int64_t estimate_ns_ = -1;
  uint32_t sparse_run_ = 0;  // waits past the cap in a row
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_ADAPTIVE_SPIN_H_
