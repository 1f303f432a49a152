// RpcConnection, bulk payloads: a call's gate over its payload, the limits on what a peer may
// send, pulling a peer's payload with RDMA READ, exposing one for the peer to pull, sending one
// zero-copy or staged, and withdrawing one whose call ended.

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/bulk/registration.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/connection/rpc_connection_internal.h"
#include "transport/log.h"

namespace zrpc::internal {
namespace {

// Posts the READs of `pending`'s payload, one per range the message names, into the `sinks`
// (as many), counted in `pulling`. On failure nothing was posted: `pending` is freed (its
// landing released) and the message is still the caller's.
absl::Status PostPull(transport::Connection& connection,
                      absl::Span<const transport::BulkSource> sinks, PendingPull* pending,
                      std::atomic<uint32_t>& pulling) {
  const MessageLayout& layout = pending->message.layout;
  transport::Connection::ReadPart parts[2];
  for (int i = 0; i < layout.pull_count; ++i) {
    parts[i] = {sinks[i], transport::RemoteRange{layout.pulls[i].addr, layout.pulls[i].rkey}};
  }
  pulling.fetch_add(1, std::memory_order_relaxed);
  absl::Status read = connection.ReadBulk(absl::MakeConstSpan(parts, layout.pull_count),
                                          reinterpret_cast<uintptr_t>(pending) | kPullTag);
  if (!read.ok()) {
    pulling.fetch_sub(1, std::memory_order_relaxed);
    if (pending->landing) pending->landing->Released();
    delete pending;
  }
  return read;
}

// The most payloads one connection may have exposed outside a call's gate (a server's responses,
// either side's stream messages) and not yet pulled: a peer that never says kPulled holds this
// side's memory registered only this far.
constexpr size_t kMaxExposedPerConnection = 1024;

// Memory for a pulled payload of `size` bytes, registered on `device` and charged to `budget`
// (which the caller took already: the record gives it back when it goes).
absl::StatusOr<std::unique_ptr<PulledPayload>> AllocatePulled(transport::Device& device,
                                                              std::shared_ptr<ReceiveLimits> budget,
                                                              uint32_t size) {
  auto payload = std::make_unique<PulledPayload>();
  payload->budget = std::move(budget);  // from here its destructor gives the bytes back
  payload->size = size;
  constexpr size_t kPage = 4096;
  const size_t pages = (size_t{size} + kPage - 1) / kPage;
  payload->data = static_cast<uint8_t*>(std::aligned_alloc(kPage, pages * kPage));
  if (payload->data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for a ", size, "-byte payload"));
  }
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> region =
      device.RegisterMemory(payload->data, size);
  if (!region.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot receive a ", size, "-byte payload: ", region.status().message()));
  }
  payload->region = *std::move(region);
  return payload;
}

}  // namespace

void BulkGate::Released() {
  InlineFunction<void(), 48> then;
  {
    absl::MutexLock lock(&mu_);
    if (--held_ > 0) return;
    token_ = 0;
    then = std::move(then_);
  }
  if (then) then();
}

void BulkGate::End() {
  ExposureHold source;
  std::function<void(BulkGate&, bool)> retire;
  bool exposed;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    retire = std::move(retire_);
    exposed = !source_.empty();
    if (!retire) source = std::move(source_);
  }
  // Outside the lock: a payload's release opens this gate (Released), and the hook may
  // withdraw it (Withdraw takes the lock).
  if (retire) retire(*this, exposed);
}

bool BulkGate::SetRetire(std::function<void(BulkGate&, bool)> retire) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  retire_ = std::move(retire);
  return true;
}

void BulkGate::Withdraw(bool orphan) {
  ExposureHold source;
  {
    absl::MutexLock lock(&mu_);
    source = std::move(source_);
  }
  source.End(orphan);  // outside the lock, as in End
}

bool BulkGate::Begin() {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  held_ = 1;
  return true;
}

bool BulkGate::Hold(ExposureHold& source) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  source_ = std::move(source);
  return true;
}

absl::Status ReceiveLimits::MessageTooLarge(uint64_t size, absl::string_view what) const {
  return absl::ResourceExhaustedError(absl::StrCat("a ", size, "-byte ", what, " exceeds the ",
                                                   max_message_size_, " bytes ", side_,
                                                   "::max_message_size allows"));
}

absl::Status ReceiveLimits::CheckBulk(uint64_t size) const {
  if (size <= max_bulk_size_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("a ", size, "-byte bulk payload exceeds the ",
                                                   max_bulk_size_, " bytes ", side_,
                                                   "::max_bulk_size allows"));
}

absl::Status ReceiveLimits::Take(uint64_t bytes, uint64_t bulk_bytes) {
  if (absl::Status fits = CheckBulk(bulk_bytes); !fits.ok()) return fits;
  uint64_t used = in_use_.load(std::memory_order_relaxed);
  do {
    if (used + bytes > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no memory for a ", bytes, "-byte payload: ", used, " of the ", budget_, " bytes ", side_,
          "::max_pulled_bytes allows are held by payloads pulled and not released"));
    }
  } while (!in_use_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return absl::OkStatus();
}

void BulkGate::AfterRelease(InlineFunction<void(), 48> then) {
  {
    absl::MutexLock lock(&mu_);
    if (held_ > 0) {
      then_ = std::move(then);
      return;
    }
  }
  then();
}

absl::Status RpcConnection::StartPull(transport::Connection& connection,
                                      const IncomingMessage& message) {
  const uint32_t size = message.header.bulk_size;
  if (absl::Status taken = receive_limits_->Take(size, message.bulk_size()); !taken.ok())
    return taken;
  absl::StatusOr<std::unique_ptr<PulledPayload>> payload =
      AllocatePulled(*device_, receive_limits_, size);
  if (!payload.ok()) return payload.status();
  // Two ranges (a large body and a bulk payload) land back to back, as one written payload.
  const uint32_t lkey = (*payload)->region->lkey();
  uint8_t* const data = (*payload)->data;
  const uint32_t first = message.layout.pull_count == 2 ? message.layout.payload_body : size;
  const transport::BulkSource sinks[2] = {{data, first, lkey}, {data + first, size - first, lkey}};
  return PostPull(connection, sinks,
                  new PendingPull{message, *std::move(payload), nullptr, nullptr, nullptr},
                  pulling_);
}

absl::Status RpcConnection::StartPullInto(transport::Connection& connection,
                                          const IncomingMessage& message,
                                          const BulkDestination& destination,
                                          std::shared_ptr<BulkGate> landing,
                                          std::function<void()> release) {
  std::unique_ptr<PlacedPayload> placed;
  if (release) placed.reset(new PlacedPayload{destination, std::move(release)});
  // Nothing started: the landing opens again (PostPull does the same when the READ is refused),
  // and `placed` gives the destination back as it goes.
  auto fail = [&](absl::Status status) {
    if (landing) landing->Released();
    return status;
  };
  // A large body lands in this side's memory, the bulk payload in the caller's.
  std::unique_ptr<PulledPayload> body;
  transport::BulkSource sinks[2];
  int sink = 0;
  if (const uint32_t body_size = message.layout.payload_body; body_size > 0) {
    if (absl::Status taken = receive_limits_->Take(body_size, 0); !taken.ok()) return fail(taken);
    absl::StatusOr<std::unique_ptr<PulledPayload>> allocated =
        AllocatePulled(*device_, receive_limits_, body_size);
    if (!allocated.ok()) return fail(allocated.status());
    body = *std::move(allocated);
    sinks[sink++] = {body->data, body_size, body->region->lkey()};
  }
  if (message.bulk_size() > 0) {
    sinks[sink++] = {destination.data(), message.bulk_size(),
                     BulkAccess::registration(destination)->lkey()};
  }
  return PostPull(connection, absl::MakeConstSpan(sinks, sink),
                  new PendingPull{message, std::move(body), destination.data(), std::move(landing),
                                  std::move(placed)},
                  pulling_);
}

bool RpcConnection::Unexpose(uint64_t call_id, uint64_t addr) {
  ExposureHold exposed;
  {
    absl::MutexLock lock(&exposed_mu_);
    auto it = exposed_.find(std::make_pair(call_id, addr));
    if (it == exposed_.end()) return false;
    exposed = std::move(it->second);
    exposed_.erase(it);
  }
  // Ended outside the lock: its release may run the application's callback.
  return true;
}

bool RpcConnection::Exposed(uint64_t call_id, const void* addr) {
  absl::MutexLock lock(&exposed_mu_);
  return exposed_.contains(std::make_pair(call_id, reinterpret_cast<uintptr_t>(addr)));
}

absl::Status RpcConnection::SendPulledWord(transport::Connection& connection,
                                           const IncomingMessage& message) {
  const PulledWord word{RpcHeader::Pulled(message.header.call_id, message.layout.pulls[0].addr),
                        message.layout.invalidate_rkey};
  absl::Status sent = SendPulledWordNow(connection, word);
  if (sent.code() != absl::StatusCode::kResourceExhausted || !connection.open()) return sent;
  // Every send slot is taken (this side streams hard): kept until a completion frees one, since
  // a word never sent pins the peer's payload until the connection closes.
  {
    absl::MutexLock lock(&pulled_mu_);
    pulled_backlog_.push_back(word);
    pulled_backlog_pending_.store(true, std::memory_order_release);
  }
  connection.NotifyWhenSendSlotFree();
  return absl::OkStatus();
}

absl::Status RpcConnection::SendPulledWordNow(transport::Connection& connection,
                                              const PulledWord& word) {
  if (word.rkey == 0) return SendHeaderOnly(connection, word.header);
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  EncodeRpcHeader(word.header, buffer->data);
  absl::MutexLock lock(&send_mu_);
  return connection.SendInvalidating(*buffer, RpcHeader::kSize, word.rkey);
}

void RpcConnection::SendPulledBacklog(transport::Connection& connection) {
  if (!pulled_backlog_pending_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&pulled_mu_);
  while (!pulled_backlog_.empty()) {
    const absl::Status sent = SendPulledWordNow(connection, pulled_backlog_.front());
    if (sent.code() == absl::StatusCode::kResourceExhausted && connection.open()) {
      connection.NotifyWhenSendSlotFree();
      break;
    }
    pulled_backlog_.pop_front();  // sent, or the connection is closing: nothing more to tell
  }
  pulled_backlog_pending_.store(!pulled_backlog_.empty(), std::memory_order_release);
}

absl::Status RpcConnection::SendPulled(transport::Connection& connection,
                                       const transport::SendBuffer& buffer, RpcHeader header,
                                       size_t body_size, OutgoingBulk bulk, OutgoingBulk large_body,
                                       absl::Time deadline, BulkGate* gate) {
  auto fail = [&](absl::Status status) {
    connection.ReleaseSendBuffer(buffer);
    return status;
  };
  // The SEND carries the inline body, or a large body's trailer, then a descriptor per part.
  const int parts = (large_body.empty() ? 0 : 1) + (bulk.empty() ? 0 : 1);
  const size_t trailer =
      (large_body.empty() ? 0 : LargeBody::kSize) + PullDescriptor::kSize * parts;
  if (body_size + trailer > MaxBody(connection)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("a ", body_size, "-byte message and the ", trailer,
                     "-byte descriptors of its pulled payload exceed a message's ",
                     MaxBody(connection), " bytes")));
  }
  // Without windows, a registration per part (said once at startup: SayNoWindowsOnce).
  bool windows = device_->has_windows();
  const auto total = static_cast<uint32_t>(bulk.size() + large_body.size());
  const uint32_t exposed_bulk = static_cast<uint32_t>(bulk.size());
  const bool has_body = !large_body.empty();
  auto source = std::make_unique<ExposedPayload>();
  source->bulk = std::move(bulk);
  source->body = std::move(large_body);
  // Exactly each part's bytes, for remote READ only, for this call only: the body first.
  transport::ExposedRange ranges[2];
  PullDescriptor descriptors[2];
  int count = 0;
  // Each part's region: the caller's registration or one of its own, for windows (whose keys
  // replace the regions' below), or one registered for remote READ, whose key is the descriptor's.
  auto register_parts = [&]() -> absl::Status {
    count = 0;
    for (OutgoingBulk* part : {&source->body, &source->bulk}) {
      if (part->empty()) continue;
      std::unique_ptr<transport::MemoryRegion>& owned =
          part == &source->bulk ? source->region : source->body_region;
      owned.reset();
      const transport::MemoryRegion* region = windows ? WindowRegion(*part) : nullptr;
      if (region == nullptr) {
        absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> registered =
            windows ? device_->RegisterForWindows(part->data(), part->size())
                    : device_->RegisterForRemoteRead(part->data(), part->size());
        if (!registered.ok()) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "cannot expose a ", part->size(), "-byte payload: ", registered.status().message()));
        }
        owned = *std::move(registered);
        region = owned.get();
      }
      ranges[count] = {part->data(), static_cast<uint32_t>(part->size()), region};
      descriptors[count].addr = reinterpret_cast<uintptr_t>(part->data());
      descriptors[count].rkey = region->rkey();
      ++count;
    }
    return absl::OkStatus();
  };
  if (absl::Status registered = register_parts(); !registered.ok()) return fail(registered);
  source->count = &exposed_count_;  // the connection outlives it: OnClosed drops what it holds
  exposed_count_.fetch_add(1, std::memory_order_relaxed);

  ExposureHold hold;
  transport::ExposureKeys keys;
  if (windows) {
    absl::StatusOr<transport::ExposureKeys> reserved =
        connection.Expose(absl::MakeConstSpan(ranges, count),
                          reinterpret_cast<uintptr_t>(source.get()) | kExposureTag);
    if (reserved.ok()) {
      keys = *reserved;
    } else if (reserved.status().code() == absl::StatusCode::kResourceExhausted) {
      // max_exposures open on this connection already (a client with thousands of pulled
      // requests in flight): this one is exposed the way a device without windows does it.
      windows = false;
      if (absl::Status registered = register_parts(); !registered.ok()) return fail(registered);
    } else {
      return fail(absl::Status(
          reserved.status().code(),
          absl::StrCat("cannot expose a ", total, "-byte payload: ", reserved.status().message())));
    }
  }
  if (windows) {
    source.release();  // the transport's: OnSendDone(token) frees it once its keys are dead
    hold = ExposureHold(&connection, keys.id);
    for (int i = 0; i < count; ++i) {
      descriptors[i].rkey = keys.rkeys[i];
      descriptors[i].flags = kPullWindow;
    }
  } else {
    hold = ExposureHold(std::move(source));
  }
  uint8_t* out = Body(buffer) + body_size;
  if (has_body) {
    EncodeLargeBody(static_cast<uint32_t>(ranges[0].size), out);
    out += LargeBody::kSize;
  }
  for (int i = 0; i < count; ++i) {
    EncodePullDescriptor(descriptors[i], out);
    out += PullDescriptor::kSize;
  }
  EncodeForSend(header, kRpcFlagBulk | kRpcFlagPull | (has_body ? kRpcFlagLargeBody : 0), total,
                deadline, buffer.data);
  // Held before the message leaves: the peer's answer may come at once. The hold withdraws the
  // payload (ending the exposure) when it goes without being kept.
  if (gate != nullptr) {
    if (!PrepareExposure(header.call_id, *gate) || !gate->Hold(hold)) {
      return fail(absl::CancelledError("the call ended before its payload was exposed"));
    }
  } else {
    absl::MutexLock lock(&exposed_mu_);
    if (exposed_closed_) {
      return fail(absl::UnavailableError(
          absl::StrCat("the connection to ", connection.peer_address(), " closed")));
    }
    if (exposed_.size() >= kMaxExposedPerConnection) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "the peer has not pulled ", exposed_.size(), " earlier payloads on this connection")));
    }
    if (!exposed_.emplace(std::make_pair(header.call_id, descriptors[0].addr), std::move(hold))
             .second) {
      return fail(absl::InternalError("a second exposed payload at one address for one call"));
    }
  }
  staging_.NoteZeroCopy(exposed_bulk);
  const auto length = static_cast<uint32_t>(RpcHeader::kSize + body_size + trailer);
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    // With windows, their binds go first, in the same queue: the peer's READ finds them bound.
    sent =
        windows ? connection.SendExposing(keys, buffer, length) : connection.Send(buffer, length);
  }
  // Never sent: nobody will pull it.
  if (!sent.ok()) {
    if (gate != nullptr) {
      gate->Withdraw();
    } else {
      Unexpose(header.call_id, descriptors[0].addr);
    }
  }
  return sent;
}

const transport::MemoryRegion* RpcConnection::WindowRegion(const OutgoingBulk& part) const {
  const Registration* registration = BulkAccess::registration(part);
  if (registration == nullptr || registration->device() != device_.get()) return nullptr;
  // Where a window opens the whole region beneath it (rxe), only a part that is the whole
  // registration may use it; any other needs a region of exactly its bytes.
  if (!device_->windows_bound_range() &&
      (part.data() != registration->data() || part.size() != registration->size())) {
    return nullptr;
  }
  return &registration->region();
}

absl::Status RpcConnection::SendZeroCopy(transport::Connection& connection,
                                         const transport::SendBuffer& buffer, RpcHeader header,
                                         size_t body_size, OutgoingBulk bulk, absl::Time deadline,
                                         BulkGate* gate) {
  const transport::BulkSource source{bulk.data(), static_cast<uint32_t>(bulk.size()),
                                     BulkAccess::registration(bulk)->lkey()};
  EncodeForSend(header, kRpcFlagBulk, source.size, deadline, buffer.data);
  auto* record = new ZeroCopySend{std::move(bulk)};
  const uint64_t token = reinterpret_cast<uintptr_t>(record) | kZeroCopyTag;
  bool written;
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    if (gate != nullptr) {
      absl::MutexLock gate_lock(&gate->mu_);
      if (gate->held_ > 0) gate->token_ = token;
    }
    // Once written, the record is the transport's: OnSendDone frees it, also when the WRITE
    // fails later or is flushed.
    sent = WriteThenSendLocked(connection, source, token, buffer, body_size, &written);
  }
  if (!written) {
    connection.ReleaseSendBuffer(buffer);
    delete record;  // outside the send lock: the release may end a call, whose callback sends
  }
  return sent;
}

absl::Status RpcConnection::WriteThenSendLocked(transport::Connection& connection,
                                                const transport::BulkSource& source, uint64_t token,
                                                const transport::SendBuffer& buffer,
                                                size_t body_size, bool* written) {
  // Both or neither, as one transport operation: the peer pairs the payload with the message
  // that follows it.
  absl::Status status = connection.WriteBulkThenSend(
      source, token, buffer, static_cast<uint32_t>(RpcHeader::kSize + body_size));
  *written = status.ok();
  return status;
}

void RpcConnection::Withdraw(transport::Connection& connection, uint64_t call_id, BulkGate& gate) {
  std::optional<Deferred> deferred;
  {
    absl::MutexLock lock(&quota_mu_);
    for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
      if (it->header.kind == RpcKind::kRequest && it->header.call_id == call_id) {
        deferred = std::move(*it);
        deferred_.erase(it);
        break;
      }
    }
  }
  if (deferred) {
    connection.ReleaseSendBuffer(deferred->buffer);
    deferred->bulk.Reset();
    deferred->large_body.Reset();
    return;
  }
  // Under the send lock no payload is queued, so the token (read while its record lives: the
  // record's release clears it) cannot name a newer record at a reused address; and the
  // transport carries out operations in the order they were asked for, so a payload queued after
  // this lock is let go is withdrawn from (never: a newer record) after this withdrawal. A
  // withdrawn WRITE is reported like a flushed one (OnSendDone, kCancelled), which frees the
  // record: the payload's release there may end the call.
  absl::MutexLock lock(&send_mu_);
  uint64_t token;
  {
    absl::MutexLock gate_lock(&gate.mu_);
    token = gate.token_;
  }
  if (token != 0) connection.WithdrawBulk(token);
}

absl::Status RpcConnection::StageAndSend(transport::Connection& connection,
                                         const transport::SendBuffer& buffer, RpcHeader header,
                                         size_t body_size, OutgoingBulk bulk,
                                         OutgoingBulk large_body, absl::Time deadline) {
  const size_t total = large_body.size() + bulk.size();
  const size_t capacity = StagingPool::CapacityFor(total);
  absl::StatusOr<StagingPool::Buffer*> acquired = staging_.Acquire(total);
  if (!acquired.ok()) {
    ReturnQuota(capacity);
    WakeQuotaWaiters();
    connection.ReleaseSendBuffer(buffer);
    return acquired.status();
  }
  StagingPool::Buffer* staged = *acquired;
  uint8_t flags = kRpcFlagBulk;
  if (!large_body.empty()) {
    std::memcpy(staged->data, large_body.data(), large_body.size());
    EncodeLargeBody(static_cast<uint32_t>(large_body.size()), Body(buffer) + body_size);
    body_size += LargeBody::kSize;
    flags |= kRpcFlagLargeBody;
  }
  if (!bulk.empty()) std::memcpy(staged->data + large_body.size(), bulk.data(), bulk.size());
  staging_.NoteStaged(total);
  // The bytes are in staging memory: the caller may reuse them from here on.
  bulk.Reset();
  large_body.Reset();
  // A request's remaining time is taken now, after the staging, not when the call began.
  EncodeForSend(header, flags, static_cast<uint32_t>(total), deadline, buffer.data);

  bool written;
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    // Once written, the staging buffer is the transport's: OnSendDone gives it (and its quota)
    // back, also when the WRITE fails later or is flushed.
    sent = WriteThenSendLocked(
        connection, transport::BulkSource{staged->data, static_cast<uint32_t>(total), staged->lkey},
        reinterpret_cast<uintptr_t>(staged), buffer, body_size, &written);
  }
  if (!written) {
    staging_.Release(staged);
    ReturnQuota(capacity);
    WakeQuotaWaiters();
    connection.ReleaseSendBuffer(buffer);
  }
  return sent;
}

}  // namespace zrpc::internal
