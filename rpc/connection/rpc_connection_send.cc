// RpcConnection, sending: a message with or without a payload (choosing written, zero-copy,
// staged or pulled), waiting for a send slot, answers, errors, and the staging quota that holds
// a connection's payloads behind one another.

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/bulk/registration.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/connection/rpc_connection_internal.h"
#include "transport/log.h"

namespace zrpc::internal {

absl::Status RpcConnection::SendMessage(transport::Connection& connection,
                                        const transport::SendBuffer& buffer, RpcHeader header,
                                        size_t body_size, OutgoingBulk bulk,
                                        OutgoingBulk large_body, absl::Time deadline,
                                        BulkGate* gate, bool expose) {
  const uint64_t total = uint64_t{bulk.size()} + large_body.size();
  if (total > std::numeric_limits<uint32_t>::max()) {
    connection.ReleaseSendBuffer(buffer);
    return absl::InvalidArgumentError(
        absl::StrCat("a ", large_body.size(), "-byte message and a ", bulk.size(),
                     "-byte bulk payload: at most 4 GiB - 1 bytes of both go with one call"));
  }
  if (total > 0) {
    if (expose || total > connection.peer_arena_size()) {
      // Too large for the peer's arena: the peer pulls it.
      return SendPulled(connection, buffer, header, body_size, std::move(bulk),
                        std::move(large_body), deadline, gate);
    }
    // A large body is staged, and a bulk payload beside it with it: one WRITE carries both.
    const Registration* registration =
        large_body.empty() ? BulkAccess::registration(bulk) : nullptr;
    if (registration != nullptr) {
      if (registration->device() == device_.get()) {
        return SendZeroCopy(connection, buffer, header, body_size, std::move(bulk), deadline, gate);
      }
      if (!warned_foreign_.exchange(true, std::memory_order_relaxed)) {
        ZRPC_LOG(kWarning, side_, "a bulk payload to ", connection.peer_address(),
                 " lies in memory registered on another device (another channel's or server's "
                 "device options): it is staged, not sent zero-copy; register it on the "
                 "channel or server that sends it (logged once per connection)");
      }
    }
    const size_t capacity = StagingPool::CapacityFor(total);
    {
      absl::MutexLock lock(&quota_mu_);
      if (!deferred_.empty() || staged_ + capacity > StagingQuota(connection)) {
        // Behind this connection's earlier payloads (see the top of rpc_connection.h).
        deferred_.push_back(
            Deferred{buffer, header, body_size, std::move(bulk), std::move(large_body), deadline});
        return absl::OkStatus();
      }
      staged_ += capacity;
    }
    return StageAndSend(connection, buffer, header, body_size, std::move(bulk),
                        std::move(large_body), deadline);
  }
  EncodeForSend(header, 0, 0, deadline, buffer.data);
  // No send lock: a payload and its message are queued together by the transport
  // (WriteBulkThenSend), so a message alone cannot come between them.
  return connection.Send(buffer, static_cast<uint32_t>(RpcHeader::kSize + body_size));
}

absl::StatusOr<transport::SendBuffer> RpcConnection::AcquireSendBufferWaiting(
    transport::Connection& connection, bool may_wait, absl::FunctionRef<absl::Status()> stop,
    uint32_t leave_free) {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer(leave_free);
    if (buffer.ok() || buffer.status().code() != absl::StatusCode::kResourceExhausted ||
        !connection.open()) {
      return buffer;
    }
    if (absl::Status stopped = stop(); !stopped.ok()) return stopped;
    if (!may_wait) {
      return absl::ResourceExhaustedError(absl::StrCat(
          buffer.status().message(),
          "; a callback on a runtime thread (poller or timer) does "
          "not wait for a slot, since that thread is the one that frees them: start the call "
          "from another thread, or raise ConnectionOptions::max_send_slots"));
    }
    if (attempt < 64) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(100));
    }
  }
}

absl::Status RpcConnection::SendAnswer(transport::Connection& connection,
                                       const transport::SendBuffer& buffer, RpcHeader header,
                                       size_t body_size, uint64_t answered) {
  EncodeForSend(header, 0, 0, absl::InfiniteFuture(), buffer.data);
  return connection.ReleaseAndSend(answered, buffer,
                                   static_cast<uint32_t>(RpcHeader::kSize + body_size));
}

bool RpcConnection::ReturnQuota(size_t capacity) {
  absl::MutexLock lock(&quota_mu_);
  staged_ -= capacity;
  quota_freed_.SignalAll();
  return !deferred_.empty();
}

void RpcConnection::WakeQuotaWaiters() {
  std::vector<std::weak_ptr<StreamListener>> waiters;
  {
    absl::MutexLock lock(&quota_mu_);
    if (quota_waiters_.empty()) return;
    waiters = quota_waiters_.Take();
  }
  StreamWaiters::Tell(waiters);
}

namespace {
std::atomic<int64_t> slot_retry_nanos{absl::ToInt64Nanoseconds(kSlotRetry)};
}  // namespace

absl::Duration SlotRetry() {
  return absl::Nanoseconds(slot_retry_nanos.load(std::memory_order_relaxed));
}

void SetSlotRetryForTesting(absl::Duration retry) {
  slot_retry_nanos.store(absl::ToInt64Nanoseconds(retry), std::memory_order_relaxed);
}

void RpcConnection::WaitForSendSlot(transport::Connection& connection,
                                    std::weak_ptr<StreamListener> waiter) {
  {
    absl::MutexLock lock(&slot_waiters_mu_);
    if (!slot_waiters_.Add(std::move(waiter))) return;
    slot_waiters_pending_.store(true, std::memory_order_release);
  }
  // After the waiter is in: a notice raised from here on finds it.
  connection.NotifyWhenSendSlotFree();
}

void RpcConnection::TellSlotWaiters() {
  if (!slot_waiters_pending()) return;
  std::vector<std::weak_ptr<StreamListener>> waiters;
  {
    absl::MutexLock lock(&slot_waiters_mu_);
    waiters = slot_waiters_.Take();
    slot_waiters_pending_.store(false, std::memory_order_release);
  }
  StreamWaiters::Tell(waiters);
}

void RpcConnection::OnSendSlotFree(transport::Connection& connection) {
  SendPulledBacklog(connection);  // first: a word the peer waits for to free its memory
  TellSlotWaiters();
}

bool RpcConnection::TakeQuotaOrWait(const transport::Connection& connection, size_t size,
                                    std::weak_ptr<StreamListener> waiter) {
  const size_t capacity = StagingPool::CapacityFor(size);
  absl::MutexLock lock(&quota_mu_);
  // Behind deferred payloads, as a waiting SendStreamMessage is not: it must not wait forever
  // behind a stream of them, and a callback's retry costs nothing while it waits.
  if (staged_ + capacity <= StagingQuota(connection)) {
    staged_ += capacity;
    return true;
  }
  quota_waiters_.Add(std::move(waiter));
  return false;
}

void RpcConnection::SendDeferred(transport::Connection& connection) {
  for (;;) {
    Deferred next;
    {
      absl::MutexLock lock(&quota_mu_);
      if (deferred_.empty()) return;
      const size_t capacity = StagingPool::CapacityFor(deferred_.front().bulk.size() +
                                                       deferred_.front().large_body.size());
      if (staged_ + capacity > StagingQuota(connection)) return;  // a later completion retries
      next = std::move(deferred_.front());
      deferred_.pop_front();
      staged_ += capacity;
    }
    const RpcHeader header = next.header;
    absl::Status sent =
        StageAndSend(connection, next.buffer, next.header, next.body_size, std::move(next.bulk),
                     std::move(next.large_body), next.deadline);
    if (!sent.ok() && connection.open()) OnDeferredFailed(connection, header, sent);
  }
}

absl::Status RpcConnection::SendHeaderOnly(transport::Connection& connection,
                                           const RpcHeader& header) {
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  return SendMessage(connection, *buffer, header, 0, OutgoingBulk());
}

absl::Status RpcConnection::SendError(transport::Connection& connection, uint64_t call_id,
                                      const absl::Status& status, const Metadata* trailing) {
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  RpcHeader header = RpcHeader::Error(call_id, status.code());
  bool dropped = false;
  const size_t wanted = MetadataBlockSize(trailing, &status, &dropped);
  // With slots too small for the block, the code and the message go without it.
  const size_t block = wanted > 0 && MetadataFits(connection, wanted).ok() ? wanted : 0;
  size_t body = 0;
  if (block > 0) {
    EncodeMetadataBlock(trailing, &status, Body(*buffer));
    header.flags |= kRpcFlagMetadata;
    body = block;
  }
  const size_t limit = std::min(kMaxErrorMessage, MaxBody(connection) - block);
  // What did not fit is said in the message, so a caller missing a detail learns why.
  std::string noted;
  absl::string_view message = status.message();
  if (dropped || block < wanted) {
    noted = absl::StrCat(message,
                         " [status payloads or trailing metadata that did not fit were "
                         "dropped]");
    message = noted;
  }
  body += EncodeErrorBody(message, Body(*buffer) + block, limit);
  return SendMessage(connection, *buffer, header, body, OutgoingBulk());
}

absl::Status RpcConnection::MetadataFits(const transport::Connection& connection, size_t block) {
  constexpr size_t kBeside = LargeBody::kSize + 2 * PullDescriptor::kSize;
  if (block + kBeside <= MaxBody(connection)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the call's metadata takes ", block, " bytes encoded; a message on this connection holds ",
      MaxBody(connection) > kBeside ? MaxBody(connection) - kBeside : 0,
      " bytes of it (its receive slots are ", connection.max_message_size(),
      " bytes: the smaller side's slots.slot_size)"));
}

namespace {
thread_local bool on_runtime_timer = false;
}  // namespace

bool OnRuntimeThread() { return on_runtime_timer || transport::Poller::OnPollerThread(); }
void MarkRuntimeTimerThread() { on_runtime_timer = true; }

}  // namespace zrpc::internal
