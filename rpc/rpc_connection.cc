#include "rpc/rpc_connection.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

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
  static_cast<void>(held->connection->Release(held->handle));
  delete held;
}

void RpcConnection::OnBulk(transport::Connection& connection,
                           const transport::ReceivedBulk& bulk) {
  if (unpaired_) {
    static_cast<void>(connection.Release(bulk.handle));
    Violation(connection, "a second bulk payload arrived before the message of the first");
    return;
  }
  unpaired_ = bulk;
}

void RpcConnection::OnSendDone(transport::Connection&, uint64_t token, const absl::Status&) {
  // Messages carry token 0; a bulk WRITE carries its staging buffer, free once the NIC is done
  // with it (completed or flushed: either way it reads no more).
  if (token != 0) staging_.Release(reinterpret_cast<StagingPool::Buffer*>(token));
}

absl::StatusOr<IncomingMessage> RpcConnection::Receive(transport::Connection& connection,
                                                       const transport::ReceivedMessage& message) {
  absl::StatusOr<RpcHeader> header =
      DecodeRpcHeader(absl::MakeConstSpan(message.data, message.size));
  std::optional<transport::ReceivedBulk> bulk = std::exchange(unpaired_, std::nullopt);
  absl::Status violation;
  if (!header.ok()) {
    violation = header.status();
  } else if (header->has_bulk() && !bulk) {
    violation = absl::FailedPreconditionError(
        absl::StrCat("call ", header->call_id, " claims a ", header->bulk_size,
                     "-byte bulk payload that did not arrive before it"));
  } else if (!header->has_bulk() && bulk) {
    violation = absl::FailedPreconditionError(
        absl::StrCat("a ", bulk->size, "-byte bulk payload was followed by call ",
                     header->call_id, ", which does not claim it"));
  } else if (bulk && bulk->size != header->bulk_size) {
    violation = absl::FailedPreconditionError(
        absl::StrCat("call ", header->call_id, " claims a ", header->bulk_size,
                     "-byte bulk payload but ", bulk->size, " bytes arrived"));
  }
  if (!violation.ok()) {
    static_cast<void>(connection.Release(message.handle));
    if (bulk) static_cast<void>(connection.Release(bulk->handle));
    Violation(connection, violation.message());
    return violation;
  }
  IncomingMessage incoming;
  incoming.header = *header;
  incoming.body = absl::MakeConstSpan(message.data + RpcHeader::kSize,
                                      message.size - RpcHeader::kSize);
  incoming.handle = message.handle;
  incoming.bulk = bulk;
  return incoming;
}

void RpcConnection::Violation(transport::Connection& connection, absl::string_view what) {
  violations_.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr, "zrpc %s: closing the connection to %s: protocol violation: %.*s\n", side_,
               connection.peer_address().c_str(), static_cast<int>(what.size()), what.data());
  connection.Close();
}

void RpcConnection::Discard(transport::Connection& connection, const IncomingMessage& message) {
  static_cast<void>(connection.Release(message.handle));
  if (message.bulk) static_cast<void>(connection.Release(message.bulk->handle));
}

void RpcConnection::DropUnpairedBulk(transport::Connection& connection) {
  if (unpaired_) static_cast<void>(connection.Release(unpaired_->handle));
  unpaired_.reset();
}

absl::Status RpcConnection::SendMessage(transport::Connection& connection,
                                        const transport::SendBuffer& buffer, RpcHeader header,
                                        size_t body_size, OutgoingBulk bulk) {
  const size_t length = RpcHeader::kSize + body_size;
  StagingPool::Buffer* staged = nullptr;
  if (!bulk.empty()) {
    absl::Status refused;
    if (bulk.size() > connection.peer_arena_size()) {
      refused = absl::InvalidArgumentError(
          absl::StrCat("a ", bulk.size(), "-byte bulk payload exceeds the ",
                       connection.peer_arena_size(), " bytes the peer can receive at once"));
    } else if (absl::StatusOr<StagingPool::Buffer*> s = staging_.Acquire(bulk.size()); !s.ok()) {
      refused = s.status();
    } else {
      staged = *s;
      std::memcpy(staged->data, bulk.data(), bulk.size());
    }
    if (!refused.ok()) {
      connection.ReleaseSendBuffer(buffer);
      return refused;
    }
    header.flags |= kRpcFlagBulk;
    header.bulk_size = static_cast<uint32_t>(bulk.size());
  }
  const uint32_t bulk_size = header.bulk_size;
  bulk.Reset();  // the bytes are in staging memory: the caller may reuse them from here on
  EncodeRpcHeader(header, buffer.data);

  absl::MutexLock lock(&send_mu_);
  if (staged != nullptr) {
    absl::Status written = connection.WriteBulk(
        transport::BulkSource{staged->data, bulk_size, staged->lkey},
        reinterpret_cast<uintptr_t>(staged));
    if (!written.ok()) {
      staging_.Release(staged);
      connection.ReleaseSendBuffer(buffer);
      return written;
    }
  }
  absl::Status sent = connection.Send(buffer, static_cast<uint32_t>(length), 0);
  if (!sent.ok() && staged != nullptr) {
    // The payload is posted and its message is not: the peer would pair the payload with the
    // next message. Nothing on this connection can be trusted to pair any more.
    connection.Close();
  }
  return sent;
}

absl::Status RpcConnection::SendHeaderOnly(transport::Connection& connection,
                                           const RpcHeader& header) {
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  return SendMessage(connection, *buffer, header, 0, OutgoingBulk());
}

absl::Status RpcConnection::SendError(transport::Connection& connection, uint64_t call_id,
                                      const absl::Status& status) {
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  const size_t limit = std::min(kMaxErrorMessage, MaxBody(connection));
  const size_t body = EncodeErrorBody(status.message(), Body(*buffer), limit);
  return SendMessage(connection, *buffer, RpcHeader::Error(call_id, status.code()), body,
                     OutgoingBulk());
}

}  // namespace zrpc::internal
