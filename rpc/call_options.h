// What a caller sets per call and what tells it the call ended: CallOptions (deadline,
// cancellation, where a response payload lands), Cancellation, and the callbacks of the
// asynchronous forms (DoneCallback, StreamCallback).
//
// Contract: a CallOptions is read when the call starts and may be destroyed right after; the
// Cancellation it points to is shared with the runtime until the call ends. A DoneCallback runs
// exactly once, on a runtime thread, or inline on the caller's thread when the call fails
// before it is sent; it must not block. Any thread may start calls.
#ifndef ZRPC_RPC_CALL_OPTIONS_H_
#define ZRPC_RPC_CALL_OPTIONS_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/bulk.h"
#include "rpc/impl/inline_function.h"
#include "rpc/metadata.h"

namespace zrpc {

// Lets a caller give up on a call before its deadline. Cancel() ends the call with kCancelled
// (its DoneCallback runs, or the blocking call returns) and tells the server, whose handler sees
// ServerContext::IsCancelled(); a response that arrives afterwards is dropped. A call started
// with a Cancellation already cancelled fails at once without being sent. Cancelling a call
// that already ended does nothing. One Cancellation per call; any thread.
class Cancellation {
 public:
  // What Cancel() runs: kept inline (no allocation per call), as DoneCallback.
  using Hook = internal::InlineFunction<void(), 48>;

  void Cancel() {
    Hook hook;
    {
      ::absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
      hook = ::std::move(hook_);
    }
    if (hook) hook();
  }
  bool cancelled() const {
    ::absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // For the runtime: what Cancel() does to the call in flight. Runs `hook` at once (and returns
  // false) when Cancel() came first.
  bool SetHook(Hook hook) {
    {
      ::absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        hook_ = ::std::move(hook);
        return true;
      }
    }
    hook();
    return false;
  }

 private:
  mutable ::absl::Mutex mu_;
  bool cancelled_ = false;
  Hook hook_;
};

// Per-call options.
struct CallOptions {
  // The call fails with kDeadlineExceeded if no response has arrived by then (the wall clock,
  // absl::Now(); read once, when the call starts, and counted on the monotonic clock from there).
  ::absl::Time deadline = ::absl::InfiniteFuture();
  // The same, relative: the call fails with kDeadlineExceeded if no response has arrived this
  // long after it started (the stub was called). Counted on the monotonic clock from the call's
  // start, so one CallOptions serves any number of calls, each with the whole timeout. With
  // both set, whichever ends first applies. A timeout costs no clock read of its own: the call
  // reads the clock once when it starts, whatever it is given.
  ::absl::Duration timeout = ::absl::InfiniteDuration();
  // Optional: lets the caller cancel the call (see Cancellation).
  ::std::shared_ptr<Cancellation> cancellation;
  // Optional, for methods with a response payload: where it lands (bulk.h, BulkDestination).
  BulkDestination response_destination;
  // gRPC's wait_for_ready. False (the default): with no connection open and the last attempt
  // failed, the call fails UNAVAILABLE at once, quoting that attempt's error, until the
  // channel's reconnection backoff allows another (rpc/channel.h, "Connections"). True: the call
  // waits instead, on the calling thread, connecting again as the backoff allows, until a
  // connection opens (the call then goes), its deadline passes (DEADLINE_EXCEEDED quoting the
  // last attempt's error; with no deadline it waits for as long as it takes), it is cancelled
  // (CANCELLED), or an attempt fails for a reason that will not pass (a bad address, an
  // incompatible server: that error). A call started on a runtime thread (a callback) never
  // waits. Only the wait for a connection: a call that failed once sent is not retried.
  bool wait_for_ready = false;
  // Metadata sent with the call (metadata.h): the handler reads it as
  // ServerContext::client_metadata(). With a stream, it goes with the stream's opening. Empty
  // (the default) costs nothing: no byte on the wire. Encoded into the request when the call
  // starts.
  Metadata metadata;
  // Optional: where the handler's trailing metadata lands (ServerContext::AddTrailingMetadata).
  // Cleared when the call starts and filled before it ends (its DoneCallback runs, the blocking
  // call returns, a stream's Finish returns), so it must outlive the call; left empty when the
  // call ended without an answer from the handler (a deadline, a cancel, a lost connection).
  Metadata* trailing_metadata = nullptr;

  // Options with `timeout` (relative to each call's start) and nothing else set.
  static CallOptions Timeout(::absl::Duration timeout) {
    CallOptions options;
    options.timeout = timeout;
    return options;
  }
};

// Runs once when an asynchronous call ends: OK, or why it failed.
// A call's completion callback: any callable taking the status, kept inside the callback (no
// heap allocation per call) when it captures up to 48 bytes. Move-only.
using DoneCallback = internal::InlineFunction<void(::absl::Status), 48>;

// Runs once when an asynchronous stream's Read or Write completes: true when the message was
// read or sent, false once the stream has no more (rpc/streaming.h). Move-only, as DoneCallback.
using StreamCallback = internal::InlineFunction<void(bool), 48>;

}  // namespace zrpc

#endif  // ZRPC_RPC_CALL_OPTIONS_H_
