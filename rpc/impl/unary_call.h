// A client stub's unary call: AsyncUnaryCall sizes the request, serializes it straight into a
// registered send slot and starts the call on the Channel; UnaryCall is its blocking form.
//
// rpc/impl/ is for generated code and the runtime, not for applications: nothing here is a
// stable API, and any of it may change in any release (rpc/impl/README.md).
#ifndef ZRPC_RPC_IMPL_UNARY_CALL_H_
#define ZRPC_RPC_IMPL_UNARY_CALL_H_

#include <google/protobuf/message_lite.h>

#include <chrono>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/bulk.h"
#include "rpc/call_options.h"
#include "rpc/impl/call_interfaces.h"
#include "rpc/impl/call_waiter.h"
#include "rpc/service.h"

namespace zrpc {

namespace internal {

// Serializes `request` straight into a registered slot and starts the call. `request_bulk` is
// released when the call fails here, or by the channel (before `done`, see StartUnaryCall).
template <typename Request>
void AsyncUnaryCall(Channel* channel, const MethodInfo& method, const Request& request,
                    OutgoingBulk request_bulk, ::google::protobuf::MessageLite* response,
                    IncomingBulk* response_bulk, const CallOptions& options, DoneCallback done) {
  if (method.response_bulk && response_bulk == nullptr) {
    request_bulk.Reset();
    done(::absl::InvalidArgumentError(::std::string(method.full_name) +
                                      ": response_bulk must not be null"));
    return;
  }
  if (response_bulk != nullptr) response_bulk->Reset();
  const size_t size = request.ByteSizeLong();  // caches sizes for the serializer below
  ::absl::StatusOr<SendSlot> slot = ChannelAccess::AcquireSendSlot(channel, method, size, options);
  if (!slot.ok()) {
    request_bulk.Reset();  // before `done`: the caller may reuse the bytes from there on
    done(slot.status());
    return;
  }
  request.SerializeWithCachedSizesToArray(slot->data);
  ChannelAccess::StartUnaryCall(channel, method, *::std::move(slot), ::std::move(request_bulk),
                                response, response_bulk, options, ::std::move(done));
}

// The blocking form: waits for AsyncUnaryCall's callback.
template <typename Request>
::absl::Status UnaryCall(Channel* channel, const MethodInfo& method, const Request& request,
                         OutgoingBulk request_bulk, ::google::protobuf::MessageLite* response,
                         IncomingBulk* response_bulk, const CallOptions& options) {
  // Read before the call starts: once it has, the channel may be destroyed at any moment (its
  // destruction ends this call, and the wait below needs nothing of it).
  const BlockingWait wait = ChannelAccess::blocking_wait(channel);
  CallWaiter finished;
  ::absl::Status result;
  AsyncUnaryCall(channel, method, request, ::std::move(request_bulk), response, response_bulk,
                 options, [&](::absl::Status status) {
                   result = ::std::move(status);
                   finished.Notify();
                 });
  const ::std::chrono::nanoseconds waited = finished.Wait(wait.spin, wait.learn != nullptr);
  if (wait.learn != nullptr) wait.learn(waited, wait.cap);
  return result;
}

}  // namespace internal

}  // namespace zrpc

#endif  // ZRPC_RPC_IMPL_UNARY_CALL_H_
