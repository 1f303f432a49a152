// CallWaiter: how a blocking call waits for its answer. The caller polls a flag for a short
// budget, then sleeps on a futex; the runtime thread that finishes the call sets the flag and
// wakes it only if it went to sleep.
//
// Why not absl::Notification: it takes its mutex three times per call (wait, notify, destroy),
// and every answer then costs a futex wake-up of the caller: microseconds on hardware, more than
// the RDMA round trip it waits for. An answer that comes within the spin budget costs neither
// (adaptive polling, as eRPC's and UCX's callers poll). Linux only, as RDMA is here.
//
// Lifetime: Notify touches the waiter's memory only in its one atomic exchange; the futex wake
// after it passes the address to the kernel, which tolerates a waiter already gone (the wake
// finds nobody, or at worst wakes a later futex at the same address early, which every futex
// waiter re-checks for). So the waiter may live on the caller's stack and be destroyed as soon
// as Wait returns.
#ifndef ZRPC_RPC_IMPL_CALL_WAITER_H_
#define ZRPC_RPC_IMPL_CALL_WAITER_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace zrpc::internal {

class CallWaiter {
 public:
  CallWaiter() = default;
  CallWaiter(const CallWaiter&) = delete;
  CallWaiter& operator=(const CallWaiter&) = delete;

  // Marks the call done (what it wrote before is visible to Wait's return) and wakes the
  // waiter if it sleeps. Once only; any thread.
  void Notify() {
    void* const word = &state_;  // taken before the exchange, after which the waiter may go
    if (state_.exchange(kDone, ::std::memory_order_acq_rel) == kSleeping) {
      syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }

  // Returns once Notify has run: polls for up to `spin`, then sleeps. With `measure`, returns
  // how long it waited (for the caller's adaptive spin: transport/adaptive_spin.h), else zero.
  ::std::chrono::nanoseconds Wait(::std::chrono::nanoseconds spin, bool measure = false) {
    using Clock = ::std::chrono::steady_clock;
    const bool timed = measure || spin.count() > 0;
    const Clock::time_point start = timed ? Clock::now() : Clock::time_point();
    auto waited = [&] {
      return measure
                 ? ::std::chrono::duration_cast<::std::chrono::nanoseconds>(Clock::now() - start)
                 : ::std::chrono::nanoseconds(0);
    };
    if (spin.count() > 0) {
      const Clock::time_point until = start + spin;
      do {
        for (int i = 0; i < 64; ++i) {
          if (state_.load(::std::memory_order_acquire) == kDone) return waited();
          Relax();
        }
      } while (Clock::now() < until);
    }
    uint32_t expected = kIdle;
    if (!state_.compare_exchange_strong(expected, kSleeping, ::std::memory_order_acq_rel)) {
      return waited();  // done meanwhile
    }
    // The kernel sleeps only while the word still reads kSleeping, so a Notify between the
    // exchange above and this call is not missed; the loop absorbs early wake-ups.
    while (state_.load(::std::memory_order_acquire) != kDone) {
      syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, kSleeping, nullptr, nullptr, 0);
    }
    return waited();
  }

  bool done() const { return state_.load(::std::memory_order_acquire) == kDone; }

 private:
  static constexpr uint32_t kIdle = 0;
  static constexpr uint32_t kSleeping = 1;
  static constexpr uint32_t kDone = 2;

  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  ::std::atomic<uint32_t> state_{kIdle};
};

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_IMPL_CALL_WAITER_H_
