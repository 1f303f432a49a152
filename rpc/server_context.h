// ServerContext: what a handler sees of the call it serves (its deadline, whether the caller
// gave up).
//
// Contract: the runtime fills it in before the handler runs and keeps it valid until the call is
// finished. IsCancelled() may be called from any thread; Cancel() and SetRemaining() are the
// runtime's.
#ifndef ZRPC_RPC_SERVER_CONTEXT_H_
#define ZRPC_RPC_SERVER_CONTEXT_H_

#include <atomic>
#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zrpc {

// What a handler sees of the call it serves; the runtime fills it in before the handler runs.
struct ServerContext {
  // When the caller stops waiting, on this host's clock: the remaining time its request carried,
  // counted from the request's arrival (InfiniteFuture when the caller set no deadline).
  ::absl::Time deadline = ::absl::InfiniteFuture();

  // Whether the caller has given up on the call: it cancelled it, its deadline passed, its
  // connection failed, or the server's shutdown grace ran out. A handler doing long work should
  // check and stop early; whatever it answers then is discarded. The deadline is read on the
  // monotonic clock when the runtime set it (SetRemaining): a step of the wall clock does not
  // move it.
  bool IsCancelled() const {
    if (cancelled_.load(::std::memory_order_relaxed)) return true;
    if (monotonic_deadline_ == kUnset) return ::absl::Now() >= deadline;
    if (monotonic_deadline_ == ::std::chrono::steady_clock::time_point::max()) return false;
    return ::std::chrono::steady_clock::now() >= monotonic_deadline_;
  }
  // For the runtime: marks the call given up. Any thread.
  void Cancel() { cancelled_.store(true, ::std::memory_order_relaxed); }
  // For the runtime: the call has `remaining` left (InfiniteDuration: no deadline), counted
  // from `arrival` on the monotonic clock (the runtime read it when the request came: no second
  // read here). Sets `deadline` and the monotonic deadline IsCancelled reads.
  void SetRemaining(::absl::Duration remaining, ::std::chrono::steady_clock::time_point arrival) {
    if (remaining == ::absl::InfiniteDuration()) {
      deadline = ::absl::InfiniteFuture();
      monotonic_deadline_ = ::std::chrono::steady_clock::time_point::max();
      return;
    }
    deadline = ::absl::Now() + remaining;
    monotonic_deadline_ =
        arrival + ::std::chrono::duration_cast<::std::chrono::steady_clock::duration>(
                      ::absl::ToChronoNanoseconds(remaining));
  }
  void SetRemaining(::absl::Duration remaining) {
    SetRemaining(remaining, ::std::chrono::steady_clock::now());
  }

 private:
  static constexpr ::std::chrono::steady_clock::time_point kUnset{};
  ::std::atomic<bool> cancelled_{false};
  ::std::chrono::steady_clock::time_point monotonic_deadline_ = kUnset;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_SERVER_CONTEXT_H_
