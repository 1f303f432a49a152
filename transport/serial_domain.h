// SerialDomain: a combiner. State that only its owner may touch, and a thread that finds it
// owned leaves its operation to the owner instead of waiting.
//
// Why not a mutex. A connection's poller holds the connection's domain for a whole completion
// batch: the handlers it runs, the sends they make and the releases they give back touch the
// state with no lock at all, and what the batch sends goes out with one doorbell at its end. An
// application thread that sends meanwhile must not wait for the batch (its handlers may take
// long, and a handler that waited for that thread would deadlock) and must not take a lock the
// batch would then need for every send: it leaves its operation in the domain, and the owner
// runs it before it lets go (gRPC's combiner, folly's flat combining).
//
// The state word is 0 when free, kOwned when owned with nothing left, else the newest left
// operation (a stack: TakeLeft reverses it). One compare-and-swap enters, one leaves; an
// operation left costs one more. Nothing is ever popped alone, so the stack has no ABA problem.
//
// Contract: Enter/TryEnter and LeaveOrEnter give the domain to their caller; the owner runs what
// TakeLeft returns and calls TryExit until it succeeds:
//
//   if (domain.LeaveOrEnter(op)) return;        // the owner runs it
//   RunOne(op);                                 // this thread is the owner
//   do { RunAll(domain.TakeLeft()); } while (!domain.TryExit());
//
// An operation's memory is its owner's to free after it runs (DomainOp::run may delete it).
// Memory order: what one owner wrote is visible to the next (release on exit and on leaving an
// operation, acquire on entering and on taking them).
#ifndef ZRPC_TRANSPORT_SERIAL_DOMAIN_H_
#define ZRPC_TRANSPORT_SERIAL_DOMAIN_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"

namespace zrpc::transport {

// An operation left for a domain's owner. Intrusive: the leaver provides the memory.
struct DomainOp {
  DomainOp* next = nullptr;
  // For the domain's owner to tell kinds of operation apart (a connection's own, or a task of
  // the layer above): set by whoever makes the operation, never changed by the domain.
  bool task = false;
};

class ABSL_LOCKABLE SerialDomain {
 public:
  SerialDomain() = default;
  SerialDomain(const SerialDomain&) = delete;
  SerialDomain& operator=(const SerialDomain&) = delete;

  // Enters when free; false (and nothing changes) when another thread owns it.
  bool TryEnter() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    uintptr_t expected = 0;
    return state_.compare_exchange_strong(expected, kOwned, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  // Leaves `op` for the owner (true), or, when the domain is free, enters it instead (false: the
  // caller owns the domain and runs `op` itself).
  bool LeaveOrEnter(DomainOp* op) {
    uintptr_t state = state_.load(std::memory_order_relaxed);
    for (;;) {
      if (state == 0) {
        if (state_.compare_exchange_weak(state, kOwned, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
          return false;
        }
        continue;
      }
      op->next = state == kOwned ? nullptr : reinterpret_cast<DomainOp*>(state);
      if (state_.compare_exchange_weak(state, reinterpret_cast<uintptr_t>(op),
                                       std::memory_order_release, std::memory_order_relaxed)) {
        return true;
      }
    }
  }

  // The owner's: what was left since the last call, oldest first (linked by next), or nullptr.
  // The domain stays owned.
  DomainOp* TakeLeft() ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (state_.load(std::memory_order_relaxed) == kOwned) return nullptr;
    uintptr_t taken = state_.exchange(kOwned, std::memory_order_acquire);
    DomainOp* newest = taken == kOwned ? nullptr : reinterpret_cast<DomainOp*>(taken);
    DomainOp* oldest = nullptr;
    while (newest != nullptr) {
      DomainOp* next = newest->next;
      newest->next = oldest;
      oldest = newest;
      newest = next;
    }
    return oldest;
  }

  // The owner's: frees the domain when nothing was left since the last TakeLeft (true). False:
  // something was, and the caller still owns the domain (TakeLeft, run, try again).
  bool TryExit() ABSL_UNLOCK_FUNCTION() {
    uintptr_t expected = kOwned;
    return state_.compare_exchange_strong(expected, 0, std::memory_order_release,
                                          std::memory_order_relaxed);
  }

  // Whether an operation waits for the owner: for an owner deciding whether to take them now.
  bool HasLeft() const { return state_.load(std::memory_order_relaxed) > kOwned; }
  // Whether any thread owns it now: a hint, for assertions and diagnostics.
  bool owned() const { return state_.load(std::memory_order_relaxed) != 0; }

  // Tells the thread-safety analysis that the caller owns the domain (it entered above).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  static constexpr uintptr_t kOwned = 1;  // operations are aligned: never at address 1
  std::atomic<uintptr_t> state_{0};
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_SERIAL_DOMAIN_H_
