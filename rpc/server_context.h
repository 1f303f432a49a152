// ServerContext: what a handler sees of the call it serves (its deadline, whether the caller
// gave up, who called).
//
// Contract: the runtime fills it in before the handler runs and keeps it valid until the call is
// finished. IsCancelled(), deadline(), remaining(), peer() and auth_key_id() may be called from
// any thread; Cancel(), SetRemaining() and SetPeer() are the runtime's (a test of a handler may
// call them on its own context).
#ifndef ZRPC_RPC_SERVER_CONTEXT_H_
#define ZRPC_RPC_SERVER_CONTEXT_H_

#include <algorithm>
#include <atomic>
#include <chrono>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zrpc {

namespace internal {
class ServerCallImpl;
}  // namespace internal

// What a handler sees of the call it serves; the runtime fills it in before the handler runs.
class ServerContext {
 public:
  // Who called: the client's address as its connection came in, "ip:port" (an IPv6 address in
  // brackets, "[fe80::1]:40000"); empty in a context the runtime did not fill (a handler's unit
  // test). Valid until the call is finished.
  ::absl::string_view peer() const { return peer_; }
  // The id of the pre-shared key the client proved when it connected (ServerOptions' listener
  // auth_keys: docs/guide.md, "Who may connect"), or 0 when the server authenticates no one. The
  // key id is the caller's identity as far as zrpc knows it: every client given that key shares
  // it.
  uint32_t auth_key_id() const { return auth_key_id_; }
  // For the runtime (and tests of handlers): the call came from `peer`, which must outlive the
  // call, authenticated by key `auth_key_id` (0: none).
  void SetPeer(::absl::string_view peer, uint32_t auth_key_id) {
    peer_ = peer;
    auth_key_id_ = auth_key_id;
  }

  // When the caller stops waiting, on this host's wall clock (absl::Now()): the remaining time
  // its request carried, counted from the request's arrival (InfiniteFuture when the caller set
  // no deadline). Worked out when asked (a clock read each time: keep it, don't poll it); a
  // handler passing it on to calls of its own may set CallOptions::timeout to remaining()
  // instead, which a step of the wall clock cannot move.
  ::absl::Time deadline() const {
    if (monotonic_deadline_ == kNone) return ::absl::InfiniteFuture();
    return ::absl::Now() +
           ::absl::FromChrono(monotonic_deadline_ - ::std::chrono::steady_clock::now());
  }
  // How long until the caller stops waiting (InfiniteDuration: no deadline; at most zero once it
  // passed), on the monotonic clock.
  ::absl::Duration remaining() const {
    if (monotonic_deadline_ == kNone) return ::absl::InfiniteDuration();
    return ::std::max(::absl::ZeroDuration(),
                      ::absl::FromChrono(monotonic_deadline_ - ::std::chrono::steady_clock::now()));
  }

  // Whether the caller has given up on the call: it cancelled it, its deadline passed, its
  // connection failed, or the server's shutdown grace ran out. A handler doing long work should
  // check and stop early; whatever it answers then is discarded. The deadline is kept on the
  // monotonic clock: a step of the wall clock does not move it.
  bool IsCancelled() const {
    if (cancelled_.load(::std::memory_order_relaxed)) return true;
    if (monotonic_deadline_ == kNone) return false;
    return ::std::chrono::steady_clock::now() >= monotonic_deadline_;
  }
  // For the runtime: marks the call given up. Any thread.
  void Cancel() { cancelled_.store(true, ::std::memory_order_relaxed); }
  // For the runtime (and tests of handlers): the call has `remaining` left (InfiniteDuration:
  // no deadline), counted from `arrival` on the monotonic clock (the runtime read it when the
  // request came: no second read here).
  void SetRemaining(::absl::Duration remaining, ::std::chrono::steady_clock::time_point arrival) {
    if (remaining == ::absl::InfiniteDuration()) {
      monotonic_deadline_ = kNone;
      return;
    }
    monotonic_deadline_ =
        arrival + ::std::chrono::duration_cast<::std::chrono::steady_clock::duration>(
                      ::absl::ToChronoNanoseconds(remaining));
  }
  void SetRemaining(::absl::Duration remaining) {
    SetRemaining(remaining, ::std::chrono::steady_clock::now());
  }

 private:
  friend class internal::ServerCallImpl;  // reads the flag; checks the deadline on its own clock
  static constexpr ::std::chrono::steady_clock::time_point kNone =
      ::std::chrono::steady_clock::time_point::max();
  bool cancel_requested() const { return cancelled_.load(::std::memory_order_relaxed); }

  ::std::atomic<bool> cancelled_{false};
  ::std::chrono::steady_clock::time_point monotonic_deadline_ = kNone;
  ::absl::string_view peer_;
  uint32_t auth_key_id_ = 0;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_SERVER_CONTEXT_H_
