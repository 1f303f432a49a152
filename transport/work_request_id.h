// What a work request's wr_id says, for the connection that posted it and for the poller that
// reads its completion. A failed completion's opcode is undefined, so the kind of work request
// must be in its id.
//
//  - Send-queue work requests carry their connection's sequence number (below 2^61).
//  - The send queue's drain marker carries kMarkerBit.
//  - A connection's own receives carry kRecvBit | their index in the connection's receive table.
//  - Receives of a poller's shared receive queue carry kRecvBit | kSharedBit | their entry in the
//    queue when posted; the poller rewrites a completion's id to kRecvBit | kSharedBit | the pool
//    slot that entry held before it hands the completion to a connection, which then owns the
//    slot (shared_receive_queue.h).
#ifndef ZRPC_TRANSPORT_WORK_REQUEST_ID_H_
#define ZRPC_TRANSPORT_WORK_REQUEST_ID_H_

#include <cstdint>

namespace zrpc::transport {

inline constexpr uint64_t kRecvBit = uint64_t{1} << 63;
inline constexpr uint64_t kMarkerBit = uint64_t{1} << 62;
inline constexpr uint64_t kSharedBit = uint64_t{1} << 61;
// The index, entry or slot below the kind bits.
inline constexpr uint64_t kWorkRequestIndex = kSharedBit - 1;
inline uint32_t WorkRequestIndex(uint64_t wr_id) {
  return static_cast<uint32_t>(wr_id & kWorkRequestIndex);
}

// Whether `wr_id` is a receive of a shared queue.
inline bool IsSharedReceiveId(uint64_t wr_id) {
  return (wr_id & (kRecvBit | kSharedBit)) == (kRecvBit | kSharedBit);
}

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_WORK_REQUEST_ID_H_
