// PendingCall: one call of an AsyncService handler, which the handler owns and finishes when its
// answer is ready, from any thread. PendingCall<Request, Response> takes its template arguments
// by zrpc's one rule (rpc/streaming.h states it): the rpc's request type, then its response type.
#ifndef ZRPC_RPC_PENDING_CALL_H_
#define ZRPC_RPC_PENDING_CALL_H_

#include <cassert>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "rpc/bulk.h"
#include "rpc/impl/block_cache.h"
#include "rpc/impl/call_interfaces.h"
#include "rpc/impl/message_pool.h"
#include "rpc/impl/server_unary.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

// One call of an AsyncService handler, owned by the handler (through the ::std::unique_ptr it is
// given) until it calls Finish. It holds the parsed request, the response to fill in, the
// response's bulk payload and the runtime's ServerCall, so a handler may return at once and
// answer later from any thread: after a call to another service, after I/O.
//
//   void Get(::std::unique_ptr<::zrpc::PendingCall<ObjectKey, ObjectInfo>> call) override {
//     backend_.Lookup(call->request().name(), [call = ::std::move(call)](Value v) mutable {
//       call->response()->set_size(v.bytes.size());
//       *call->response_bulk() = ::zrpc::OutgoingBulk::Copy(::std::move(v.bytes));
//       call->Finish(::absl::OkStatus());
//     });
//   }
//
// Finish ends the call exactly once. Destroying a PendingCall that was not finished finishes it
// with kInternal ("<method>: handler dropped the call without finishing it"), so a client never
// waits for an answer that will not come. Calling Finish a second time is a programming error:
// it asserts in debug builds and does nothing in release builds (the first status stands).
//
// Not thread-safe: use it from one thread at a time, and hand it between threads the way any
// object is handed over (a queue, a mutex, moving it into a callback). context() and
// TakeRequestBulk() reach the runtime's call and may be used only before Finish; request(),
// response() and response_bulk() stay valid for as long as the PendingCall lives.
template <typename Request, typename Response>
class PendingCall {
 public:
  // For generated code (internal::HandleUnaryLater, internal::HandleUnary): `request` was parsed
  // from `call`, which this finishes; `method` (whose full name the drop error quotes) must
  // outlive this. `request_bulk`, when given, is the request's payload, already taken from
  // `call` (TakeRequestBulk returns it).
  PendingCall(ServerCall* call, const MethodInfo& method, internal::PooledMessage<Request> request,
              ::std::optional<IncomingBulk> request_bulk = ::std::nullopt)
      : call_(call),
        method_(&method),
        request_(::std::move(request)),
        request_bulk_(::std::move(request_bulk)) {}

  // The same with a message of the caller's (tests, or a call finished outside the runtime):
  // moved into a pooled one.
  PendingCall(ServerCall* call, const MethodInfo& method, Request request,
              ::std::optional<IncomingBulk> request_bulk = ::std::nullopt)
      : PendingCall(call, method, internal::PooledMessage<Request>(), ::std::move(request_bulk)) {
    *request_ = ::std::move(request);
  }

  PendingCall(PendingCall&& other) noexcept
      : call_(::std::exchange(other.call_, nullptr)),
        method_(other.method_),
        request_(::std::move(other.request_)),
        response_(::std::move(other.response_)),
        response_bulk_(::std::move(other.response_bulk_)),
        request_bulk_(::std::exchange(other.request_bulk_, ::std::nullopt)) {}
  // Finishes this call first when it is still pending, as destruction would.
  PendingCall& operator=(PendingCall&& other) noexcept {
    if (this != &other) {
      FinishIfDropped();
      call_ = ::std::exchange(other.call_, nullptr);
      method_ = other.method_;
      request_ = ::std::move(other.request_);
      response_ = ::std::move(other.response_);
      response_bulk_ = ::std::move(other.response_bulk_);
      request_bulk_ = ::std::exchange(other.request_bulk_, ::std::nullopt);
    }
    return *this;
  }
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;
  ~PendingCall() { FinishIfDropped(); }

  // Made and destroyed once per call, usually on one thread (an inline handler that answers in
  // place): its memory is the thread's to reuse, no malloc per call (rpc/impl/block_cache.h).
  static void* operator new(::std::size_t size) { return internal::TakeBlock(size); }
  static void operator delete(void* block, ::std::size_t size) noexcept {
    internal::GiveBlock(block, size);
  }

  // The call's deadline and what else the runtime tells a handler. Only before Finish.
  ServerContext& context() {
    assert(call_ != nullptr && "PendingCall::context() after Finish");
    return call_->context();
  }
  const MethodInfo& method() const { return *method_; }
  const Request& request() const { return *request_; }
  // The request's bulk payload, read in place (empty for a method without request_bulk, and
  // after the first take). Release it promptly (rpc/bulk.h); it may outlive the call. One left
  // untaken is released at Finish. Only before Finish.
  IncomingBulk TakeRequestBulk() {
    assert(call_ != nullptr && "PendingCall::TakeRequestBulk() after Finish");
    if (request_bulk_) {
      IncomingBulk bulk = ::std::move(*request_bulk_);
      request_bulk_.reset();
      return bulk;
    }
    return call_ == nullptr ? IncomingBulk() : call_->TakeRequestBulk();
  }
  // What Finish(OK) sends: fill these in first. The response payload must stay alive until its
  // release callback runs (or, without one, until the server is destroyed; rpc/bulk.h).
  Response* response() { return response_.get(); }
  OutgoingBulk* response_bulk() { return &response_bulk_; }

  // Ends the call, from any thread: with `status` OK sends *response() and *response_bulk();
  // otherwise releases *response_bulk() and sends the error. Once only (see above).
  void Finish(::absl::Status status) {
    assert(call_ != nullptr && "PendingCall::Finish called twice");
    ServerCall* call = ::std::exchange(call_, nullptr);
    if (call == nullptr) return;
    request_bulk_.reset();  // one left untaken is released at Finish, as the runtime's would be
    const bool ok = status.ok();
    internal::FinishUnary(call, ::std::move(status), *response_, ::std::move(response_bulk_));
    // As HandleUnary's: the serialized response's size is cached; an unsent one is sized here.
    response_.set_size_hint(ok ? static_cast<size_t>(response_->GetCachedSize())
                               : response_->ByteSizeLong());
  }

 private:
  void FinishIfDropped() {
    if (call_ == nullptr) return;
    Finish(::absl::InternalError(::std::string(method_->full_name) +
                                 ": handler dropped the call without finishing it"));
  }

  ServerCall* call_;  // null once finished (or moved from)
  const MethodInfo* method_;
  // The finishing thread's spares once this is destroyed (rpc/impl/message_pool.h): string and
  // bytes fields keep their capacity from call to call.
  internal::PooledMessage<Request> request_;
  internal::PooledMessage<Response> response_;
  OutgoingBulk response_bulk_;
  ::std::optional<IncomingBulk> request_bulk_;  // taken before this was made (HandleUnary)
};

}  // namespace zrpc

#endif  // ZRPC_RPC_PENDING_CALL_H_
