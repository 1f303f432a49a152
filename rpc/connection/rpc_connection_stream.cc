// RpcConnection, stream frames: serializing a stream's message into a slot or, larger, into a
// payload written into the peer's arena (with the staging quota it waits for) or, past the
// peer's arena, exposed for the peer to pull.

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/bulk/registration.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/connection/rpc_connection_internal.h"
#include "transport/log.h"

namespace zrpc::internal {

absl::StatusOr<OutgoingBulk> RpcConnection::SerializeStreamMessage(
    const transport::Connection& connection, const transport::SendBuffer& buffer,
    const google::protobuf::MessageLite* message) {
  if (message == nullptr) return OutgoingBulk();
  const size_t size = message->ByteSizeLong();  // cached: the caller sized it
  if (FitsSlot(connection, size)) {
    message->SerializeWithCachedSizesToArray(Body(buffer));
    return OutgoingBulk();
  }
  auto* large = static_cast<uint8_t*>(std::malloc(size));
  if (large == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for a ", size, "-byte stream message"));
  }
  message->SerializeWithCachedSizesToArray(large);
  return OutgoingBulk(large, size, [large] { std::free(large); });
}

absl::Status RpcConnection::SendStreamFrame(transport::Connection& connection,
                                            const RpcHeader& header,
                                            const google::protobuf::MessageLite* message,
                                            size_t size, absl::FunctionRef<bool()> gone,
                                            uint32_t leave_free, bool quota_taken, bool* no_slot,
                                            OutgoingBulk* bulk) {
  // Quota taken for a message that does not go goes back (SendStreamMessage gives it back
  // itself once it has the message).
  auto not_sent = [&](absl::Status why) {
    if (quota_taken) ReturnStreamQuota(size);
    return why;
  };
  if (absl::Status fits = limits().CheckMessage(size, "stream message"); !fits.ok()) {
    return not_sent(std::move(fits));
  }
  // Built only when needed: a status with a message is an allocation, per frame otherwise.
  auto ended = [] { return absl::CancelledError("the stream ended"); };
  if (gone()) return not_sent(ended());
  const bool may_wait = !OnRuntimeThread();
  absl::StatusOr<transport::SendBuffer> buffer = AcquireSendBufferWaiting(
      connection, may_wait, [&]() { return gone() ? ended() : absl::OkStatus(); }, leave_free);
  if (!buffer.ok()) {
    if (gone()) return not_sent(ended());
    const bool exhausted =
        buffer.status().code() == absl::StatusCode::kResourceExhausted && connection.open();
    if (exhausted && no_slot != nullptr && !may_wait) *no_slot = true;
    return not_sent(exhausted ? buffer.status()
                              : absl::UnavailableError(buffer.status().message()));
  }
  absl::StatusOr<OutgoingBulk> large = SerializeStreamMessage(connection, *buffer, message);
  if (!large.ok()) {
    connection.ReleaseSendBuffer(*buffer);
    return not_sent(large.status());
  }
  const size_t body_size = large->empty() ? size : 0;
  absl::Status sent;
  if (bulk != nullptr && !bulk->empty()) {
    // Pulled by the receiver with the body when that did not fit the slot (rpc/streaming.h,
    // "Bulk payloads"): no staging, so quota taken for the body goes back.
    if (quota_taken) ReturnStreamQuota(size);
    // An exposure is named by its call and its first part's address (the pulled word carries
    // it), so bytes still exposed for an earlier message of the stream (a writer sending one
    // buffer twice) go as a copy of their own. One writer per stream: nothing exposes at this
    // address for this call between the look and the send.
    const uint8_t* first = large->empty() ? bulk->data() : large->data();
    if (Exposed(header.call_id, first)) {
      *bulk = OutgoingBulk::Copy(
          std::string(reinterpret_cast<const char*>(bulk->data()), bulk->size()));
    }
    sent = SendMessage(connection, *buffer, header, body_size, std::move(*bulk), *std::move(large),
                       absl::InfiniteFuture(), nullptr, /*expose=*/true);
  } else {
    sent = SendStreamMessage(connection, *buffer, header, body_size, *std::move(large), may_wait,
                             gone, quota_taken);
  }
  if (sent.ok() || sent.code() == absl::StatusCode::kCancelled ||
      sent.code() == absl::StatusCode::kResourceExhausted) {
    return sent;
  }
  return absl::UnavailableError(sent.message());
}

absl::Status RpcConnection::SendStreamMessage(transport::Connection& connection,
                                              const transport::SendBuffer& buffer,
                                              const RpcHeader& header, size_t body_size,
                                              OutgoingBulk large_body, bool may_wait,
                                              absl::FunctionRef<bool()> give_up, bool quota_taken) {
  if (large_body.empty()) return SendMessage(connection, buffer, header, body_size, OutgoingBulk());
  if (large_body.size() > connection.peer_arena_size()) {
    // Exposed for the peer to pull, as a large unary message is; no staging. The receiver keeps
    // the stream's later messages (and its end) behind it, so order holds (WIRE.md, "Streams").
    if (quota_taken) ReturnStreamQuota(large_body.size());
    return SendPulled(connection, buffer, header, 0, OutgoingBulk(), std::move(large_body),
                      absl::InfiniteFuture(), nullptr);
  }
  const size_t capacity = StagingPool::CapacityFor(large_body.size());
  if (!quota_taken) {
    absl::MutexLock lock(&quota_mu_);
    // Behind this connection's other staged payloads, but never queued with them (see above).
    while (staged_ + capacity > StagingQuota(connection)) {
      if (give_up() || !connection.open()) {
        connection.ReleaseSendBuffer(buffer);
        return absl::CancelledError("the stream ended while its message waited for staging");
      }
      if (!may_wait) {
        connection.ReleaseSendBuffer(buffer);
        return absl::ResourceExhaustedError(absl::StrCat(
            "the connection's staging quota (", StagingQuota(connection),
            " bytes) is full, and "
            "a ",
            large_body.size(),
            "-byte stream message sent from a runtime thread (poller "
            "or timer) does not wait for it, since that thread is the one that frees it: write "
            "large messages from another thread"));
      }
      quota_freed_.WaitWithTimeout(&quota_mu_, absl::Milliseconds(10));
    }
    staged_ += capacity;
  }
  return StageAndSend(connection, buffer, header, 0, OutgoingBulk(), std::move(large_body),
                      absl::InfiniteFuture());
}

bool RpcConnection::StreamQuotaOrWait(const transport::Connection& connection, size_t size,
                                      bool runtime_thread, std::weak_ptr<StreamListener> waiter,
                                      bool* quota_taken, bool has_bulk) {
  *quota_taken = false;
  // A slot's worth goes in the slot; past the peer's arena, or beside a bulk payload, it is
  // pulled, with no staging; off a runtime thread SendStreamMessage waits for the quota itself.
  if (!runtime_thread || has_bulk || FitsSlot(connection, size) ||
      size > connection.peer_arena_size()) {
    return true;
  }
  *quota_taken = TakeQuotaOrWait(connection, size, std::move(waiter));
  return *quota_taken;
}

void RpcConnection::ReturnStreamQuota(size_t size) {
  static_cast<void>(ReturnQuota(StagingPool::CapacityFor(size)));
  WakeQuotaWaiters();
}

}  // namespace zrpc::internal
