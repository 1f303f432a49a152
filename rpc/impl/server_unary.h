// The two ends of every unary call a server answers: ParseRequest parses the request in place
// from its receive buffer, FinishUnary serializes the response straight into a registered slot
// and finishes the call. Shared by the dispatch templates (rpc/impl/dispatch.h) and PendingCall.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_SERVER_UNARY_H_
#define ZRPC_RPC_IMPL_SERVER_UNARY_H_

#include <cstddef>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/bulk.h"
#include "rpc/impl/call_interfaces.h"

namespace zrpc {

namespace internal {

// Parses the request in place from the call's receive buffer into `*request`. When it does not
// parse, finishes the call with kInvalidArgument naming the request type and returns false.
// Shared by HandleUnary and HandleUnaryLater, so both refuse a malformed request alike.
template <typename Request>
bool ParseRequest(ServerCall* call, Request* request) {
  if (call->request_size() > static_cast<size_t>(::std::numeric_limits<int>::max()) ||
      !request->ParseFromArray(call->request_data(), static_cast<int>(call->request_size()))) {
    call->Finish(::absl::InvalidArgumentError("malformed request: it does not parse as " +
                                              request->GetTypeName()),
                 nullptr, OutgoingBulk());
    return false;
  }
  return true;
}

// The end of every call a handler answered: with `status` OK, sizes `response`, serializes it
// straight into a registered slot and finishes the call with it and `response_bulk`; otherwise
// (or when no slot can be had) releases `response_bulk` and finishes with the error. Shared by
// HandleUnary and PendingCall::Finish.
template <typename Response>
void FinishUnary(ServerCall* call, ::absl::Status status, const Response& response,
                 OutgoingBulk response_bulk) {
  if (!status.ok()) {
    response_bulk.Reset();
    call->Finish(::std::move(status), nullptr, OutgoingBulk());
    return;
  }
  ::absl::StatusOr<SendSlot> slot = call->AcquireResponseSlot(response.ByteSizeLong());
  if (!slot.ok()) {
    response_bulk.Reset();
    call->Finish(slot.status(), nullptr, OutgoingBulk());
    return;
  }
  response.SerializeWithCachedSizesToArray(slot->data);
  call->Finish(::absl::OkStatus(), &*slot, ::std::move(response_bulk));
}

}  // namespace internal

}  // namespace zrpc

#endif  // ZRPC_RPC_IMPL_SERVER_UNARY_H_
