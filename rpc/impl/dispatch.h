// A generated Dispatch's cases: HandleUnary (Foo::Service: the blocking handler, or the async
// form when the service overrode that instead) and HandleUnaryLater (Foo::AsyncService), and
// AnswerLater, the generated default of a blocking handler.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_DISPATCH_H_
#define ZRPC_RPC_IMPL_DISPATCH_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "rpc/bulk.h"
#include "rpc/impl/call_interfaces.h"
#include "rpc/impl/message_pool.h"
#include "rpc/impl/server_unary.h"
#include "rpc/pending_call.h"
#include "rpc/server_context.h"
#include "rpc/service.h"

namespace zrpc {

namespace internal {

// The async form of HandleUnary: parses the request in place (a malformed one is refused as
// HandleUnary refuses it, and the handler never runs), then runs
//   handler(::std::unique_ptr<PendingCall<Request, Response>>)
// which owns the call from there on: Dispatch may return before the call is finished.
// `method` is the method's entry in the service's table.
template <typename Request, typename Response, typename Handler>
void HandleUnaryLater(ServerCall* call, const MethodInfo& method, Handler&& handler) {
  PooledMessage<Request> request;
  if (!ParseRequest(call, request.get())) return;
  request.set_size_hint(call->request_size());
  handler(::std::make_unique<PendingCall<Request, Response>>(call, method, ::std::move(request)));
}

// Where the generated default of a blocking handler (AnswerLater) leaves word for HandleUnary:
// one per blocking handler running, on its thread's stack, found through a thread_local (so a
// default called from any other thread, or for another method, never reaches it).
struct LaterSlot {
  const MethodInfo* method = nullptr;          // the method HandleUnary is running
  bool later = false;                          // its generated default ran: serve it async
  ::std::optional<IncomingBulk> request_bulk;  // the payload that default was handed, given back
};

inline thread_local LaterSlot* current_later_slot = nullptr;

// The generated default of a blocking handler in Foo::Service, for a method the service did not
// override in its blocking form. Answers UNIMPLEMENTED naming `method`; and when it runs as
// that method's own handler (on HandleUnary's thread, for the method being dispatched: not for
// a handler calling another method's default, nor from another thread) it also tells
// HandleUnary that the method is served by its async form, Async<Method>, and gives
// `request_bulk` back for the PendingCall. HandleUnary goes async only when the handler then
// returns this UNIMPLEMENTED: a handler that called its base class and did something else with
// the answer keeps its own.
inline ::absl::Status AnswerLater(ServerContext&, const MethodInfo& method,
                                  IncomingBulk request_bulk = IncomingBulk()) {
  LaterSlot* slot = current_later_slot;
  if (slot != nullptr && slot->method == &method) {
    slot->later = true;
    slot->request_bulk.emplace(::std::move(request_bulk));
  }
  return ::absl::UnimplementedError(::std::string(method.full_name) + " is not implemented");
}

// Foo::Service's dispatch of one method, blocking or async, whichever form the service
// overrode. Parses the request in place and runs
//   handler(context, request, ::std::move(request_bulk), &response, &response_bulk)
// (generated code adapts that to the method's blocking handler); then either serializes the
// response straight into a registered slot and finishes the call, or -- when the handler was the
// generated default (AnswerLater) -- hands the call to
//   later(::std::unique_ptr<PendingCall<Request, Response>>)
// (the method's async form), which finishes it when it likes, from any thread. For a blocking
// handler that costs two thread_local stores and a test: no allocation.
//
// The request and response are the thread's spares (message_pool.h), not fresh messages: their
// string and bytes fields keep their capacity from call to call.
template <typename Request, typename Response, typename Handler, typename Later>
void HandleUnary(ServerCall* call, const MethodInfo& method, Handler&& handler, Later&& later) {
  PooledMessage<Request> pooled_request;
  Request& request = *pooled_request;
  if (!ParseRequest(call, &request)) return;
  pooled_request.set_size_hint(call->request_size());
  PooledMessage<Response> pooled_response;
  Response& response = *pooled_response;
  OutgoingBulk response_bulk;
  LaterSlot slot;
  slot.method = &method;
  ::absl::Status status;
  {
    // Restored after, however the handler leaves: it may dispatch another call on this thread
    // (an in-process channel), which sets and restores its own.
    struct Scope {
      LaterSlot* outer;
      ~Scope() { current_later_slot = outer; }
    } scope{::std::exchange(current_later_slot, &slot)};
    status = handler(call->context(), request, call->TakeRequestBulk(), &response, &response_bulk);
  }
  if (slot.later && status.code() == ::absl::StatusCode::kUnimplemented) {
    response_bulk.Reset();
    later(::std::make_unique<PendingCall<Request, Response>>(
        call, method, ::std::move(pooled_request), ::std::move(slot.request_bulk)));
    return;
  }
  const bool ok = status.ok();
  FinishUnary(call, ::std::move(status), response, ::std::move(response_bulk));
  // A response FinishUnary serialized has its size cached; an unsent one is sized here, off the
  // hot path.
  pooled_response.set_size_hint(ok ? static_cast<size_t>(response.GetCachedSize())
                                   : response.ByteSizeLong());
}

}  // namespace internal

}  // namespace zrpc

#endif  // ZRPC_RPC_IMPL_DISPATCH_H_
