// ServerContext: what a handler sees of the call it serves (its deadline, whether the caller
// gave up, who called, the metadata it sent) and the trailing metadata it answers with.
//
// Contract: the runtime fills it in before the handler runs and keeps it valid until the call is
// finished. IsCancelled(), deadline(), remaining(), peer(), auth_key_id() and client_metadata()
// may be called from any thread; AddTrailingMetadata() from one thread at a time, the handler's
// (or an interceptor's, before the handler runs: rpc/interceptor.h); trace() from any thread once
// the handler runs, SetTrace() from an interceptor's OnCallStart; Cancel(), SetRemaining(),
// SetPeer() and SetClientMetadata() are the runtime's (a test of a handler may call them on its
// own context).
#ifndef ZRPC_RPC_SERVER_CONTEXT_H_
#define ZRPC_RPC_SERVER_CONTEXT_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/metadata.h"
#include "rpc/trace_context.h"

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

  // The metadata the client sent with the call (CallOptions::metadata), in its order; empty
  // when it sent none. Valid until the call is finished.
  const Metadata& client_metadata() const {
    return client_metadata_ != nullptr ? *client_metadata_ : EmptyMetadata();
  }
  // Adds an entry to the trailing metadata that goes back with the call's answer (its response
  // or its error; a stream's end), which the caller reads through CallOptions::trailing_metadata.
  // Errors as Metadata::Add's (the trailing metadata is bounded by Metadata::kMaxSize). Call it
  // from the handler before the answer is made: a unary or streaming handler before it returns,
  // an asynchronous one (PendingCall, the ServerAsync* streams) before its Finish. An error's
  // status payloads (absl::Status::SetPayload) travel beside it in what room kMaxSize leaves; those
  // that do not fit are dropped, and the error's message says so.
  ::absl::Status AddTrailingMetadata(::absl::string_view key, ::absl::string_view value) {
    if (trailing_metadata_ == nullptr) trailing_metadata_ = ::std::make_unique<Metadata>();
    return trailing_metadata_->Add(key, value);
  }
  // What AddTrailingMetadata added so far; null when nothing was.
  const Metadata* trailing_metadata() const { return trailing_metadata_.get(); }
  // For the runtime (and tests of handlers): the client sent `metadata`.
  void SetClientMetadata(::std::unique_ptr<Metadata> metadata) {
    client_metadata_ = ::std::move(metadata);
  }

  // The call's place in a distributed trace (TraceContext), as an interceptor set it
  // (TraceInterceptor reads the caller's traceparent: rpc/trace_interceptor.h); null when none
  // did. A handler calling other services passes trace()->traceparent() on as its calls'
  // `traceparent` metadata, so that they join the trace under this call's span.
  const TraceContext* trace() const { return trace_.has_value() ? &*trace_ : nullptr; }
  void SetTrace(const TraceContext& trace) { trace_ = trace; }

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

  static const Metadata& EmptyMetadata() {
    static const Metadata* const empty = new Metadata();
    return *empty;
  }

  ::std::atomic<bool> cancelled_{false};
  ::std::chrono::steady_clock::time_point monotonic_deadline_ = kNone;
  ::absl::string_view peer_;
  uint32_t auth_key_id_ = 0;
  // Null unless the client sent metadata / the handler added some: a call without costs nothing.
  ::std::unique_ptr<Metadata> client_metadata_;
  ::std::unique_ptr<Metadata> trailing_metadata_;
  ::std::optional<TraceContext> trace_;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_SERVER_CONTEXT_H_
