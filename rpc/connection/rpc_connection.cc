// RpcConnection: what both ends of a connection share: header checks, bulk payloads (written,
// pulled, staged), sending with a payload, stream frames.

#include "rpc/connection/rpc_connection.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/bulk/registration.h"
#include "rpc/common/monotonic.h"
#include "rpc/registered_memory.h"
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

// A zero-copy payload the transport is writing: held until its WRITE is done or flushed.
struct ZeroCopySend {
  OutgoingBulk bulk;
};
// Set in the transport token of a zero-copy WRITE, and of a pull's READ (records are at least
// 8-byte aligned); a staged WRITE's token is its staging buffer's address, a message's is 0.
constexpr uint64_t kZeroCopyTag = 1;
constexpr uint64_t kPullTag = 2;
// Set in the handle of a pulled payload (PulledPayload's address); the transport's handles are
// small receive indices or carry bit 63 (arena payloads).
constexpr uint64_t kPulledHandle = uint64_t{1} << 62;

// Memory this side allocated and registered for one pulled payload, charged to its budget.
struct PulledPayload {
  std::shared_ptr<ReceiveLimits> budget;
  uint32_t size = 0;
  uint8_t* data = nullptr;
  std::unique_ptr<transport::MemoryRegion> region;
  ~PulledPayload() {
    region.reset();  // before the memory goes
    std::free(data);
    budget->Give(size);
  }
};

// A payload pulled into memory the application placed it in (ServerOptions::
// place_request_payload): its registration kept while the NIC writes there, and the
// application's release, run when this goes.
struct PlacedPayload {
  BulkDestination destination;
  std::function<void()> release;
  ~PlacedPayload() {
    if (release) release();
  }
};
// Set in the handle of a placed payload (PlacedPayload's address).
constexpr uint64_t kPlacedHandle = uint64_t{1} << 60;

// A READ in flight: the message whose payload it pulls, and where the payload lands: all of it
// in `payload`, or (into the caller's destination) its large body, if any, in `payload` and its
// bulk payload at `destination`.
struct PendingPull {
  IncomingMessage message;
  std::unique_ptr<PulledPayload> payload;
  uint8_t* destination = nullptr;
  std::shared_ptr<BulkGate> landing;      // released when the READ is done
  std::unique_ptr<PlacedPayload> placed;  // the handle of the payload at `destination`, if any
};
// The handle of a payload pulled into the caller's own memory: releasing it gives nothing back.
constexpr uint64_t kDestinationHandle = uint64_t{1} << 61;

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

// The most response payloads one connection may have exposed and not yet pulled: a client that
// never says kPulled holds the server's memory registered only this far.
constexpr size_t kMaxExposedPerConnection = 1024;

ZeroCopySend* ZeroCopyRecord(uint64_t token) {
  return reinterpret_cast<ZeroCopySend*>(static_cast<uintptr_t>(token & ~kZeroCopyTag));
}

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
  std::unique_ptr<ExposedPayload> source;
  std::function<void(BulkGate&, bool)> retire;
  bool exposed;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    retire = std::move(retire_);
    exposed = source_ != nullptr;
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
  std::unique_ptr<ExposedPayload> source;
  {
    absl::MutexLock lock(&mu_);
    source = std::move(source_);
  }
  if (source != nullptr && orphan) source->count = nullptr;
  // Destroyed outside the lock, as in End.
}

bool BulkGate::Begin() {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  held_ = 1;
  return true;
}

bool BulkGate::Hold(std::unique_ptr<ExposedPayload>& source) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  source_ = std::move(source);
  return true;
}

absl::Status ReceiveLimits::CheckMessage(uint64_t size, absl::string_view what) const {
  if (size <= max_message_size_) return absl::OkStatus();
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

absl::StatusOr<IncomingMessage> RpcConnection::Receive(transport::Connection& connection,
                                                       const transport::ReceivedMessage& message) {
  if (violations_.load(std::memory_order_relaxed) > 0) {
    // The connection is closing for breaking the protocol: what the peer sent after that is
    // not used, only given back.
    static_cast<void>(connection.Release(message.handle));
    if (std::optional<transport::ReceivedBulk> bulk = std::exchange(unpaired_, std::nullopt)) {
      static_cast<void>(connection.Release(bulk->handle));
    }
    return absl::FailedPreconditionError("the connection is closing for a protocol violation");
  }
  absl::StatusOr<RpcHeader> header =
      DecodeRpcHeader(absl::MakeConstSpan(message.data, message.size));
  std::optional<transport::ReceivedBulk> bulk = std::exchange(unpaired_, std::nullopt);
  absl::Status violation;
  absl::StatusOr<MessageLayout> layout;
  if (header.ok()) layout = DecodeLayout(*header, absl::MakeConstSpan(message.data, message.size));
  if (!header.ok()) {
    violation = header.status();
  } else if (!layout.ok()) {
    violation = layout.status();
  } else if (header->pulls()) {
    if (bulk) {
      violation = absl::FailedPreconditionError(
          absl::StrCat("a ", bulk->size, "-byte bulk payload was followed by call ",
                       header->call_id, ", which pulls its payload instead"));
    }
  } else if (header->has_bulk() && !bulk) {
    violation = absl::FailedPreconditionError(
        absl::StrCat("call ", header->call_id, " claims a ", header->bulk_size,
                     "-byte bulk payload that did not arrive before it"));
  } else if (!header->has_bulk() && bulk) {
    violation = absl::FailedPreconditionError(
        absl::StrCat("a ", bulk->size, "-byte bulk payload was followed by call ", header->call_id,
                     ", which does not claim it"));
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
  incoming.layout = *layout;
  incoming.body = layout->body;
  incoming.handle = message.handle;
  if (bulk) SplitPayload(incoming, *bulk);
  return incoming;
}

void RpcConnection::Violation(transport::Connection& connection, absl::string_view what) {
  // Logged once: the messages already received behind the first may break the rules too (a
  // stream's sender past its window sends on), and one line says what the peer did.
  if (violations_.fetch_add(1, std::memory_order_relaxed) == 0) {
    ZRPC_LOG(kError, side_, "closing the connection to ", connection.peer_address(),
             ": protocol violation: ", what);
  }
  connection.Close();
}

void RpcConnection::Discard(transport::Connection& connection, const IncomingMessage& message) {
  static_cast<void>(connection.Release(message.handle));
  if (message.bulk) ReleasePayload(connection, message.bulk->handle);
  if (message.body_payload) ReleasePayload(connection, message.body_payload->handle);
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

void RpcConnection::Unexpose(uint64_t call_id) {
  std::unique_ptr<ExposedPayload> exposed;
  {
    absl::MutexLock lock(&exposed_mu_);
    auto it = exposed_.find(call_id);
    if (it == exposed_.end()) return;  // a client repeating itself, or a closed call: nothing held
    exposed = std::move(it->second);
    exposed_.erase(it);
  }
  // Destroyed outside the lock: its release may run the application's callback.
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
  absl::flat_hash_map<uint64_t, std::unique_ptr<ExposedPayload>> exposed;
  {
    absl::MutexLock lock(&exposed_mu_);
    exposed.swap(exposed_);
  }
}

namespace {

// A request's remaining time as the header carries it (0: none), read from the clock only when
// there is a deadline.
uint64_t WireTimeout(absl::Time deadline) {
  return deadline == absl::InfiniteFuture() ? 0 : TimeoutToWire(deadline, MonotonicNow());
}

// Writes `header` into the send buffer at `out`, with `flags` and a payload of `bulk_size`
// bytes, and (a request) the time left until `deadline`, taken now: every way a message goes
// calls this last, after its payload is staged, registered or exposed.
void EncodeForSend(RpcHeader header, uint8_t flags, uint32_t bulk_size, absl::Time deadline,
                   uint8_t* out) {
  header.flags |= flags;
  header.bulk_size = bulk_size;
  if (header.kind == RpcKind::kRequest) header.timeout_us = WireTimeout(deadline);
  EncodeRpcHeader(header, out);
}

// The most staging one connection may hold: its peer's arena, rounded up to a staging buffer,
// so any payload the peer can take fits when nothing else of the connection is staged.
size_t StagingQuota(const transport::Connection& connection) {
  return StagingPool::CapacityFor(std::max<size_t>(connection.peer_arena_size(), 1));
}

}  // namespace

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
                                            uint32_t leave_free, bool quota_taken, bool* no_slot) {
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
  absl::Status sent = SendStreamMessage(connection, *buffer, header, body_size, *std::move(large),
                                        may_wait, gone, quota_taken);
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
    if (quota_taken) ReturnStreamQuota(large_body.size());
    connection.ReleaseSendBuffer(buffer);
    return absl::ResourceExhaustedError(absl::StrCat(
        "a ", large_body.size(), "-byte stream message is larger than the peer's arena (",
        connection.peer_arena_size(),
        " bytes), which a stream's messages are written into; "
        "larger ones are not supported yet"));
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

absl::Status RpcConnection::SendAnswer(transport::Connection& connection,
                                       const transport::SendBuffer& buffer, RpcHeader header,
                                       size_t body_size, uint64_t answered) {
  EncodeForSend(header, 0, 0, absl::InfiniteFuture(), buffer.data);
  return connection.ReleaseAndSend(answered, buffer,
                                   static_cast<uint32_t>(RpcHeader::kSize + body_size));
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
        absl::StrCat("a ", body_size, "-byte message leaves no room for the ", trailer,
                     "-byte descriptor of its pulled bulk payload")));
  }
  auto source = std::make_unique<ExposedPayload>();
  uint8_t* out = Body(buffer) + body_size;
  if (!large_body.empty()) {
    EncodeLargeBody(static_cast<uint32_t>(large_body.size()), out);
    out += LargeBody::kSize;
  }
  // Exactly each part's bytes, for remote READ only, for this call only: the body first.
  for (OutgoingBulk* part : {&large_body, &bulk}) {
    if (part->empty()) continue;
    absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> region =
        device_->RegisterForRemoteRead(part->data(), part->size());
    if (!region.ok()) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "cannot expose a ", part->size(), "-byte payload: ", region.status().message())));
    }
    PullDescriptor descriptor;
    descriptor.addr = reinterpret_cast<uintptr_t>(part->data());
    descriptor.rkey = (*region)->rkey();
    EncodePullDescriptor(descriptor, out);
    out += PullDescriptor::kSize;
    (part == &bulk ? source->region : source->body_region) = *std::move(region);
  }
  const auto total = static_cast<uint32_t>(bulk.size() + large_body.size());
  const uint32_t exposed_bulk = static_cast<uint32_t>(bulk.size());
  source->bulk = std::move(bulk);
  source->body = std::move(large_body);
  source->count = &exposed_count_;  // the connection outlives it: OnClosed drops what it holds
  exposed_count_.fetch_add(1, std::memory_order_relaxed);
  EncodeForSend(header,
                kRpcFlagBulk | kRpcFlagPull | (source->body.empty() ? 0 : kRpcFlagLargeBody), total,
                deadline, buffer.data);
  if (gate != nullptr) {
    if (!PrepareExposure(header.call_id, *gate) || !gate->Hold(source)) {
      // The call ended while this was prepared: withdraw (source destroyed on return).
      return fail(absl::CancelledError("the call ended before its payload was exposed"));
    }
  } else {
    absl::MutexLock lock(&exposed_mu_);
    if (exposed_.size() >= kMaxExposedPerConnection) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "the client has not pulled ", exposed_.size(), " earlier payloads on this connection")));
    }
    if (!exposed_.emplace(header.call_id, std::move(source)).second) {
      return fail(absl::InternalError("a second exposed payload for one call"));
    }
  }
  staging_.NoteZeroCopy(exposed_bulk);
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    sent = connection.Send(buffer, static_cast<uint32_t>(RpcHeader::kSize + body_size + trailer));
  }
  // Never sent: nobody will pull it.
  if (!sent.ok()) {
    if (gate != nullptr) {
      gate->Withdraw();
    } else {
      Unexpose(header.call_id);
    }
  }
  return sent;
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
  // Both or neither, under the transport's lock: the peer pairs the payload with the message
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
  ZeroCopySend* withdrawn = nullptr;
  {
    // Under the send lock no payload is queued, so the token (read while its record lives: the
    // record's release clears it) cannot name a newer record at a reused address.
    absl::MutexLock lock(&send_mu_);
    uint64_t token;
    {
      absl::MutexLock gate_lock(&gate.mu_);
      token = gate.token_;
    }
    if (token != 0 && connection.WithdrawBulk(token)) withdrawn = ZeroCopyRecord(token);
  }
  delete withdrawn;  // outside the send lock, as in SendZeroCopy
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

bool RpcConnection::StreamQuotaOrWait(const transport::Connection& connection, size_t size,
                                      bool runtime_thread, std::weak_ptr<StreamListener> waiter,
                                      bool* quota_taken) {
  *quota_taken = false;
  // A slot's worth goes in the slot; past the peer's arena SendStreamMessage refuses it; off a
  // runtime thread SendStreamMessage waits for the quota itself.
  if (!runtime_thread || FitsSlot(connection, size) || size > connection.peer_arena_size()) {
    return true;
  }
  *quota_taken = TakeQuotaOrWait(connection, size, std::move(waiter));
  return *quota_taken;
}

void RpcConnection::ReturnStreamQuota(size_t size) {
  static_cast<void>(ReturnQuota(StagingPool::CapacityFor(size)));
  WakeQuotaWaiters();
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
                                      const absl::Status& status) {
  absl::StatusOr<transport::SendBuffer> buffer = connection.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  const size_t limit = std::min(kMaxErrorMessage, MaxBody(connection));
  const size_t body = EncodeErrorBody(status.message(), Body(*buffer), limit);
  return SendMessage(connection, *buffer, RpcHeader::Error(call_id, status.code()), body,
                     OutgoingBulk());
}

namespace {
thread_local bool on_runtime_timer = false;
}  // namespace

bool OnRuntimeThread() { return on_runtime_timer || transport::Poller::OnPollerThread(); }
void MarkRuntimeTimerThread() { on_runtime_timer = true; }

}  // namespace zrpc::internal
