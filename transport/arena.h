// The receive arena: where a peer RDMA-WRITEs bulk payloads, and how both sides agree on space.
//
// Each connection registers one arena of `arena_size` bytes, with LOCAL_WRITE | REMOTE_WRITE and
// nothing else (no REMOTE_READ, no atomics), and advertises its address, rkey and size in the
// Hello (wire.h). Only that peer's QP can use the rkey, and only to write.
//
// Space is handed out as a ring, by the writer, without asking: the writer keeps a tail and the
// number of bytes in use; a payload of n bytes takes Round64(n) bytes at the tail, or, if that
// does not fit before the end of the arena, the remainder of the arena is skipped (padding) and
// the payload goes to offset 0. One exception keeps a payload as large as the arena placeable:
// when the writer knows the arena is empty (everything it wrote has been reported released), it
// restarts the ring at offset 0 and says so with the restart bit of the immediate. The writer
// WRITEs with the immediate = offset | (restart ? kArenaRestartBit : 0). The reader runs the
// same rule on every arrival, so it knows where the next payload must land and refuses (as a
// protocol error) one that claims another offset, a restart while it holds data, or more space
// than was free.
//
// Space returns when the reader's application releases payloads, in any order. The reader keeps
// arrivals in a FIFO; a release marks its entry, and the released prefix of the FIFO (padding
// included) becomes free. The reader tells the writer the cumulative count of freed bytes,
// modulo 2^32, in the arena_released field of every frame it sends (and in an explicit credit
// frame when it has nothing else to send and much has been freed, or everything has; see
// ArenaReader::ShouldReport). A payload larger than the arena is refused (never truncated); one
// that does not fit yet waits until space is released.
//
// Both classes are plain state machines with no verbs and no locks: the connection calls them
// under its own lock, and the host tests drive them directly.
#ifndef ZRPC_TRANSPORT_ARENA_H_
#define ZRPC_TRANSPORT_ARENA_H_

#include <cstdint>
#include <deque>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zrpc::transport {

// Every payload occupies a multiple of this many bytes, so payloads start cache-line aligned.
inline constexpr uint32_t kArenaAlign = 64;
// The largest arena: offsets and byte counts must stay comparable modulo 2^32.
inline constexpr uint32_t kMaxArenaSize = 1u << 30;
// Immediate of a bulk WRITE: the offset (below 2^30) or'ed with this bit when the writer
// restarted the ring at offset 0 because the arena was empty. Bit 30 is reserved (zero).
inline constexpr uint32_t kArenaRestartBit = 1u << 31;

// Where a payload goes: its offset in the arena and the immediate that tells the reader.
struct ArenaSpot {
  uint32_t offset = 0;
  uint32_t imm = 0;
};

// The writer's view of the peer's arena.
class ArenaWriter {
 public:
  // `size` 0 means the peer has no arena: every Reserve is refused.
  explicit ArenaWriter(uint32_t size) : size_(size) {}

  // OK if a payload of `length` bytes can ever fit; else kInvalidArgument saying why (empty,
  // larger than the arena, or no arena at all). Reserve refuses the same payloads.
  absl::Status CheckFits(uint32_t length) const;

  // Where a payload of `length` bytes goes, or
  //  - kInvalidArgument if it can never fit (empty, or larger than the arena), and
  //  - kUnavailable if it does not fit until the reader releases space (try again later).
  // On success the space is taken.
  absl::StatusOr<ArenaSpot> Reserve(uint32_t length);
  // Reserve for a payload CheckFits has accepted: nullopt while the arena is full. Allocates
  // nothing, for the send path's retries.
  std::optional<ArenaSpot> TryReserve(uint32_t length);

  // The reader's cumulative arena_released counter from a frame. kFailedPrecondition (a protocol
  // error) if it claims more than was ever handed out.
  absl::Status OnReleased(uint32_t released_total);

  uint32_t size() const { return size_; }
  uint32_t in_use() const { return reserved_total_ - released_total_; }

 private:
  uint32_t size_;
  uint32_t tail_ = 0;            // where the next payload goes if it fits
  uint32_t reserved_total_ = 0;  // bytes handed out (padding included), modulo 2^32
  uint32_t released_total_ = 0;  // as last reported by the reader
};

// The reader's view of its own arena.
class ArenaReader {
 public:
  explicit ArenaReader(uint32_t size) : size_(size) {}

  // A WRITE_WITH_IMM of `length` bytes with immediate `imm` arrived. Returns its sequence
  // number (for Release), or kFailedPrecondition if the peer broke the ring rule: wrong offset,
  // a restart while data is held, empty, or more bytes than were free. The payload is at
  // offset(imm).
  absl::StatusOr<uint64_t> OnArrival(uint32_t imm, uint32_t length);
  static uint32_t offset(uint32_t imm) { return imm & ~kArenaRestartBit; }

  // The application is done with arrival `sequence`. kFailedPrecondition if it was never
  // delivered or is released twice.
  absl::Status Release(uint64_t sequence);

  // The cumulative count to put in the next frame's arena_released.
  uint32_t released_total() const { return released_total_; }
  // Whether an explicit credit frame should carry released_total() now: a quarter of the arena
  // freed since the last report, or the arena empty with anything unreported. (Empty matters: a
  // writer waiting for room for a payload as large as the arena needs every byte back.)
  bool ShouldReport() const;
  // The caller put released_total() on the wire.
  void MarkReported() { reported_total_ = released_total_; }
  uint32_t in_use() const { return arrived_total_ - released_total_; }

 private:
  struct Arrival {
    uint32_t bytes;  // padding before it plus its rounded length
    bool released;
  };
  uint32_t size_;
  uint32_t expected_ = 0;        // the offset the writer's tail is at, by the ring rule
  uint32_t arrived_total_ = 0;   // bytes taken by arrivals (padding included), modulo 2^32
  uint32_t released_total_ = 0;  // bytes freed, modulo 2^32
  uint32_t reported_total_ = 0;
  uint64_t first_sequence_ = 0;  // sequence number of arrivals_.front()
  std::deque<Arrival> arrivals_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_ARENA_H_
