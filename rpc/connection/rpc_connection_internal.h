// What the files of RpcConnection's implementation share (rpc_connection_receive.cc,
// _send.cc, _bulk.cc, _stream.cc): the records a payload in flight is kept in, the tags that
// tell them apart in a transport token or a payload handle, and how every message's header is
// written last. Private to the connection/ target.
#ifndef ZRPC_RPC_CONNECTION_RPC_CONNECTION_INTERNAL_H_
#define ZRPC_RPC_CONNECTION_RPC_CONNECTION_INTERNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "rpc/bulk.h"
#include "rpc/bulk/staging.h"
#include "rpc/common/call_clock.h"
#include "rpc/common/monotonic.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/connection/rpc_header.h"
#include "transport/connection.h"

namespace zrpc::internal {

// A zero-copy payload the transport is writing: held until its WRITE is done or flushed.
struct ZeroCopySend {
  OutgoingBulk bulk;
};
// Set in the transport token of a zero-copy WRITE, and of a pull's READ (records are at least
// 8-byte aligned); a staged WRITE's token is its staging buffer's address, a message's is 0.
inline constexpr uint64_t kZeroCopyTag = 1;
inline constexpr uint64_t kPullTag = 2;
// Set in the token of an exposure through windows (ExposedPayload's address): its OnSendDone
// comes once its keys are dead, and frees the record.
inline constexpr uint64_t kExposureTag = 4;
// Set in the handle of a pulled payload (PulledPayload's address); the transport's handles are
// small receive indices or carry bit 63 (arena payloads).
inline constexpr uint64_t kPulledHandle = uint64_t{1} << 62;

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
inline constexpr uint64_t kPlacedHandle = uint64_t{1} << 60;

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
inline constexpr uint64_t kDestinationHandle = uint64_t{1} << 61;

// The record a zero-copy WRITE's token carries.
inline ZeroCopySend* ZeroCopyRecord(uint64_t token) {
  return reinterpret_cast<ZeroCopySend*>(static_cast<uintptr_t>(token & ~kZeroCopyTag));
}

// A request's remaining time as the header carries it (0: none), from the call clock's reading
// (call_clock.h: the batch's, or the starting call's) only when there is a deadline.
inline uint64_t WireTimeout(absl::Time deadline) {
  return deadline == absl::InfiniteFuture()
             ? 0
             : TimeoutToWireNanos(absl::ToUnixNanos(deadline), CallClockNanos());
}

// Writes `header` into the send buffer at `out`, with `flags` and a payload of `bulk_size`
// bytes, and (a request) the time left until `deadline`, taken now: every way a message goes
// calls this last, after its payload is staged, registered or exposed.
inline void EncodeForSend(RpcHeader header, uint8_t flags, uint32_t bulk_size, absl::Time deadline,
                          uint8_t* out) {
  header.flags |= flags;
  header.bulk_size = bulk_size;
  if (header.kind == RpcKind::kRequest) header.timeout_us = WireTimeout(deadline);
  EncodeRpcHeader(header, out);
}

// The most staging one connection may hold: its peer's arena, rounded up to a staging buffer,
// so any payload the peer can take fits when nothing else of the connection is staged.
inline size_t StagingQuota(const transport::Connection& connection) {
  return StagingPool::CapacityFor(std::max<size_t>(connection.peer_arena_size(), 1));
}

}  // namespace zrpc::internal

#endif  // ZRPC_RPC_CONNECTION_RPC_CONNECTION_INTERNAL_H_
