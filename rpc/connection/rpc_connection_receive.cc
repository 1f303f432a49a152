// RpcConnection, receiving: the poller's callbacks (a bulk payload, a message, a send or READ
// completed), the checks every message's header passes, and giving received payloads back.

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/bulk/registration.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/connection/rpc_connection_internal.h"
#include "transport/log.h"

namespace zrpc::internal {
namespace {

// What an IncomingBulk's token points at. Destroyed in reverse order: the connection (its
// queue pair, its slots) before the poller (its CQ) before the device.
struct HeldBulk {
  std::shared_ptr<transport::Device> device;
  std::shared_ptr<transport::Poller> poller;
  std::shared_ptr<transport::Connection> connection;
  uint64_t handle;
};

// Hands the parts of a message's payload, now in `payload` (written, or pulled whole), to the
// message: the large body at its front, the bulk payload after it. The bulk payload holds the
// memory when there is one (and with it the body, which is read first); else the body does.
void SplitPayload(IncomingMessage& message, const transport::ReceivedBulk& payload) {
  const uint32_t body = message.layout.payload_body;
  if (body == 0) {
    message.bulk = payload;
    return;
  }
  message.body = absl::MakeConstSpan(payload.data, body);
  if (payload.size > body) {
    message.bulk =
        transport::ReceivedBulk{payload.data + body, payload.size - body, payload.handle};
  } else {
    message.body_payload = payload;
  }
}

}  // namespace

ReceiveReleaser& ReceiveReleaser::Get() {
  static ReceiveReleaser* releaser = new ReceiveReleaser();
  return *releaser;
}

IncomingBulk ReceiveReleaser::Wrap(const RpcConnection& owner,
                                   std::shared_ptr<transport::Connection> connection,
                                   const transport::ReceivedBulk& bulk) {
  auto* held = new HeldBulk{owner.device_, owner.poller_, std::move(connection), bulk.handle};
  return IncomingBulk(bulk.data, bulk.size, &Get(), reinterpret_cast<uintptr_t>(held));
}

void ReceiveReleaser::ReleaseBulk(uint64_t token) {
  auto* held = reinterpret_cast<HeldBulk*>(static_cast<uintptr_t>(token));
  // After a failure the transport keeps the arena until the connection is destroyed, which this
  // record prevents until now; the status only says the connection is gone.
  RpcConnection::ReleasePayload(*held->connection, held->handle);
  delete held;
}

void RpcConnection::ReleasePayload(transport::Connection& connection, uint64_t handle) {
  if (handle == kDestinationHandle) return;  // the caller's memory
  if (handle & kPlacedHandle) {
    delete reinterpret_cast<PlacedPayload*>(static_cast<uintptr_t>(handle & ~kPlacedHandle));
    return;
  }
  if (handle & kPulledHandle) {
    delete reinterpret_cast<PulledPayload*>(static_cast<uintptr_t>(handle & ~kPulledHandle));
    return;
  }
  static_cast<void>(connection.Release(handle));
}

void RpcConnection::OnBulk(transport::Connection& connection, const transport::ReceivedBulk& bulk) {
  if (unpaired_) {
    static_cast<void>(connection.Release(bulk.handle));
    Violation(connection, "a second bulk payload arrived before the message of the first");
    return;
  }
  unpaired_ = bulk;
}

void RpcConnection::OnSendDone(transport::Connection& connection, uint64_t token,
                               const absl::Status& status) {
  // Messages are sent without a token (no OnSendDone); a bulk WRITE carries its record or its
  // staging buffer, free once the NIC is done with it (completed or flushed: it reads no more).
  if (token == 0) return;
  if (token & kPullTag) {
    auto* pending = reinterpret_cast<PendingPull*>(static_cast<uintptr_t>(token & ~kPullTag));
    IncomingMessage message = std::move(pending->message);
    std::unique_ptr<PulledPayload> payload = std::move(pending->payload);
    uint8_t* const destination = pending->destination;
    std::shared_ptr<BulkGate> landing = std::move(pending->landing);
    std::unique_ptr<PlacedPayload> placed = std::move(pending->placed);  // released on failure
    delete pending;
    pulling_.fetch_sub(1, std::memory_order_relaxed);
    // Done or flushed: the NIC writes no more into the payload's memory. A call that ended
    // meanwhile may now end (the caller gets its destination back).
    if (landing) landing->Released();
    if (!status.ok()) {
      Discard(connection, message);  // the connection is failing
      return;
    }
    if (payload) {
      const transport::ReceivedBulk pulled{
          payload->data, payload->size, reinterpret_cast<uintptr_t>(payload.get()) | kPulledHandle};
      payload.release();  // the handle owns it now
      if (destination == nullptr) {
        SplitPayload(message, pulled);
      } else {
        message.body = absl::MakeConstSpan(pulled.data, pulled.size);  // the large body alone
        message.body_payload = pulled;
      }
    }
    if (destination != nullptr && message.bulk_size() > 0) {
      const uint64_t handle = placed ? reinterpret_cast<uintptr_t>(placed.release()) | kPlacedHandle
                                     : kDestinationHandle;
      message.bulk = transport::ReceivedBulk{destination, message.bulk_size(), handle};
    }
    message.layout.pull_count = 0;
    OnPulled(connection, message);
    return;
  }
  if (token & kExposureTag) {
    // The exposure's keys are dead (the peer invalidated one, it was ended, or the connection
    // closed): nothing reads the payload any more. Its release may end a client's call.
    delete reinterpret_cast<ExposedPayload*>(static_cast<uintptr_t>(token & ~kExposureTag));
    return;
  }
  if (token & kZeroCopyTag) {
    ZeroCopySend* record = ZeroCopyRecord(token);
    if (status.ok()) staging_.NoteZeroCopy(record->bulk.size());
    delete record;  // the payload's release runs here: a client's call may end in it
    return;
  }
  auto* staged = reinterpret_cast<StagingPool::Buffer*>(token);
  const size_t capacity = staged->capacity;
  staging_.Release(staged);
  if (ReturnQuota(capacity)) SendDeferred(connection);
  WakeQuotaWaiters();
}

bool RpcConnection::Receive(transport::Connection& connection,
                            const transport::ReceivedMessage& message, IncomingMessage* incoming) {
  if (violations_.load(std::memory_order_relaxed) > 0) {
    // The connection is closing for breaking the protocol: what the peer sent after that is
    // not used, only given back.
    static_cast<void>(connection.Release(message.handle));
    if (std::optional<transport::ReceivedBulk> bulk = std::exchange(unpaired_, std::nullopt)) {
      static_cast<void>(connection.Release(bulk->handle));
    }
    return false;
  }
  const absl::Span<const uint8_t> bytes = absl::MakeConstSpan(message.data, message.size);
  std::optional<transport::ReceivedBulk> bulk = std::exchange(unpaired_, std::nullopt);
  absl::StatusOr<RpcHeader> header = DecodeRpcHeader(bytes);
  if (!header.ok()) {
    Refuse(connection, message, bulk, header.status().message());
    return false;
  }
  absl::StatusOr<MessageLayout> layout = DecodeLayout(*header, bytes);
  if (!layout.ok()) {
    Refuse(connection, message, bulk, layout.status().message());
    return false;
  }
  // A payload pairs with the message after it: one that pulls has none, one that claims one
  // has it, of the size claimed.
  const bool paired = header->pulls() ? !bulk
                                      : header->has_bulk() == bulk.has_value() &&
                                            (!bulk || bulk->size == header->bulk_size);
  if (!paired) {
    Refuse(connection, message, bulk, PairingError(*header, bulk).message());
    return false;
  }
  incoming->header = *header;
  incoming->layout = *layout;
  incoming->body = layout->body;
  incoming->handle = message.handle;
  if (bulk) SplitPayload(*incoming, *bulk);
  return true;
}

void RpcConnection::Refuse(transport::Connection& connection,
                           const transport::ReceivedMessage& message,
                           const std::optional<transport::ReceivedBulk>& bulk,
                           absl::string_view why) {
  static_cast<void>(connection.Release(message.handle));
  if (bulk) static_cast<void>(connection.Release(bulk->handle));
  Violation(connection, why);
}

absl::Status RpcConnection::PairingError(const RpcHeader& header,
                                         const std::optional<transport::ReceivedBulk>& bulk) {
  if (header.pulls()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a ", bulk->size, "-byte bulk payload was followed by call ", header.call_id,
                     ", which pulls its payload instead"));
  }
  if (header.has_bulk() && !bulk) {
    return absl::FailedPreconditionError(
        absl::StrCat("call ", header.call_id, " claims a ", header.bulk_size,
                     "-byte bulk payload that did not arrive before it"));
  }
  if (!header.has_bulk()) {
    return absl::FailedPreconditionError(absl::StrCat("a ", bulk->size,
                                                      "-byte bulk payload was followed by call ",
                                                      header.call_id, ", which does not claim it"));
  }
  return absl::FailedPreconditionError(absl::StrCat("call ", header.call_id, " claims a ",
                                                    header.bulk_size, "-byte bulk payload but ",
                                                    bulk->size, " bytes arrived"));
}

void RpcConnection::NoteError(absl::string_view what) {
  absl::MutexLock lock(&error_mu_);
  last_error_.what.assign(what.data(), what.size());
  last_error_.when = absl::Now();
}

RpcConnection::LastError RpcConnection::last_error() const {
  absl::MutexLock lock(&error_mu_);
  return last_error_;
}

void RpcConnection::Violation(transport::Connection& connection, absl::string_view what) {
  // The first, as the log's line: what follows it is often its consequence.
  if (violations() == 0) NoteError(absl::StrCat("protocol violation: ", what));
  // Logged once: the messages already received behind the first may break the rules too (a
  // stream's sender past its window sends on), and one line says what the peer did.
  if (violations_.fetch_add(1, std::memory_order_relaxed) == 0) {
    ZRPC_LOG(kError, side_, "closing the connection to ", connection.peer_address(),
             ": protocol violation: ", what);
  }
  connection.Close();
}

std::function<void()> RpcConnection::TakePulledBody(IncomingMessage& message) {
  if (!message.body_payload || (message.body_payload->handle & kPulledHandle) == 0) return nullptr;
  auto* payload = reinterpret_cast<PulledPayload*>(
      static_cast<uintptr_t>(message.body_payload->handle & ~kPulledHandle));
  message.body_payload.reset();
  return [payload] { delete payload; };
}

IncomingBulk RpcConnection::TakeBulk(transport::Connection& connection,
                                     IncomingMessage& message) const {
  if (!message.bulk) return IncomingBulk();
  IncomingBulk bulk = ReceiveReleaser::Wrap(*this, connection.shared_from_this(), *message.bulk);
  message.bulk.reset();  // the application's now
  return bulk;
}

const char* RpcConnection::StreamFrameError(bool stream, bool bulk_allowed,
                                            const IncomingMessage& frame) {
  if (!stream) return "a stream frame for a unary call";
  if (frame.bulk_size() == 0 && !frame.bulk) return nullptr;
  if (!bulk_allowed) return "a stream message with a bulk payload, for a method that carries none";
  // Exposed, not yet read: a payload written into the arena would stay there while the reader
  // holds it, and hold up every payload behind it on the connection.
  if (frame.bulk || !frame.pulls()) {
    return "a stream message whose bulk payload was written, not exposed for pulling";
  }
  return nullptr;
}

void RpcConnection::Discard(transport::Connection& connection, const IncomingMessage& message) {
  static_cast<void>(connection.Release(message.handle));
  if (message.bulk) ReleasePayload(connection, message.bulk->handle);
  if (message.body_payload) ReleasePayload(connection, message.body_payload->handle);
}

void RpcConnection::DropPending(transport::Connection& connection) {
  if (unpaired_) static_cast<void>(connection.Release(unpaired_->handle));
  unpaired_.reset();
  std::deque<Deferred> dropped;
  {
    absl::MutexLock lock(&quota_mu_);
    dropped.swap(deferred_);
  }
  for (Deferred& d : dropped) {
    connection.ReleaseSendBuffer(d.buffer);
    d.bulk.Reset();
    d.large_body.Reset();
  }
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, ExposureHold> exposed;
  {
    absl::MutexLock lock(&exposed_mu_);
    exposed.swap(exposed_);
    exposed_closed_ = true;
  }
  // Ended here, outside the lock (an exposure through windows ended with the connection already:
  // ending it again does nothing).
}

}  // namespace zrpc::internal
