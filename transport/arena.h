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
// Loans. A side that lends its arena on demand (Hello flag kHelloArenaOnDemand; a server's
// connections by default) holds no arena while its peer writes nothing. Its arena is a piece of a
// pool the poller shares among its connections (arena_pool.h), lent to one peer at a time through
// a memory window bound to that connection's QP, and only while the peer asks for it:
//  - the writer, with a payload to place and no loan, sends ask (kArena frames, wire.h) and waits;
//  - the reader takes a piece of the pool when one is free, binds a window over it, and sends
//    lend(loan, addr, key, size); loans are numbered from 1, each above the last;
//  - the reader recalls a loan it wants back (the pool is short and this one is idle): recall
//    (loan). The writer stops placing payloads in it and answers returned(loan), posted after
//    every WRITE it made into the loan, so on the reader's side those have all landed before the
//    returned does (an RC queue pair runs its requests in order);
//  - once returned and every payload in it released, the reader destroys the window (the key
//    dies on its NIC) and gives the piece back. The writer may ask again at once.
// Every step is checked against the state it needs: a lend not asked for, a write into an arena
// not lent or after returned, a recall or returned naming another loan are protocol errors that
// fail the connection. The ring runs within each loan from offset 0, its counters (released
// totals) continuing across loans: a loan starts with nothing in use on either side.
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
  // The writer of a peer that lends its arena, of `size` bytes, on demand: no space until a loan.
  static ArenaWriter OnDemand(uint32_t size) {
    ArenaWriter writer(size);
    writer.on_demand_ = true;
    return writer;
  }

  // OK if a payload of `length` bytes can ever fit; else kInvalidArgument saying why (empty,
  // larger than the arena, or no arena at all). Reserve refuses the same payloads.
  absl::Status CheckFits(uint32_t length) const;

  // Where a payload of `length` bytes goes, or
  //  - kInvalidArgument if it can never fit (empty, or larger than the arena), and
  //  - kUnavailable if it does not fit until the reader releases space (try again later).
  // On success the space is taken.
  absl::StatusOr<ArenaSpot> Reserve(uint32_t length);
  // Reserve for a payload CheckFits has accepted: nullopt while the arena is full, or not lent.
  // Allocates nothing, for the send path's retries.
  std::optional<ArenaSpot> TryReserve(uint32_t length);

  // ---- Loans (the arena lent on demand).
  // A payload waits for a loan nobody asked for yet: send ask, then Asked().
  bool ShouldAsk() const { return on_demand_ && !held_ && !asked_; }
  void Asked() { asked_ = true; }
  // A lend arrived, after its frame's arena_released was taken (OnReleased). kFailedPrecondition
  // unless this side asked, the size is the Hello's, the loan's number is above the last one's and
  // nothing of an earlier loan is still in use.
  absl::Status OnLend(uint32_t loan, uint32_t size);
  // A recall arrived. kFailedPrecondition unless it names the loan held. The loan ends here:
  // nothing more is placed in it, and the caller sends returned(loan) after what it posted.
  absl::Status OnRecall(uint32_t loan);
  bool on_demand() const { return on_demand_; }
  bool held() const { return !on_demand_ || held_; }
  uint32_t loan() const { return loan_; }

  // The reader's cumulative arena_released counter from a frame. kFailedPrecondition (a protocol
  // error) if it claims more than was ever handed out.
  absl::Status OnReleased(uint32_t released_total);

  uint32_t size() const { return size_; }
  uint32_t in_use() const { return reserved_total_ - released_total_; }

 private:
  uint32_t size_;
  bool on_demand_ = false;
  bool held_ = false;            // on demand: a loan is held
  bool asked_ = false;           // on demand: an ask was sent and no lend came yet
  uint32_t loan_ = 0;            // the last loan's number
  uint32_t tail_ = 0;            // where the next payload goes if it fits
  uint32_t reserved_total_ = 0;  // bytes handed out (padding included), modulo 2^32
  uint32_t released_total_ = 0;  // as last reported by the reader
};

// The reader's view of its own arena.
class ArenaReader {
 public:
  explicit ArenaReader(uint32_t size) : size_(size) {}
  // An arena of `size` bytes lent on demand: no payload may arrive until a loan.
  static ArenaReader OnDemand(uint32_t size) {
    ArenaReader reader(size);
    reader.on_demand_ = true;
    return reader;
  }

  // A WRITE_WITH_IMM of `length` bytes with immediate `imm` arrived. Returns its sequence
  // number (for Release), or kFailedPrecondition if the peer broke the ring rule: wrong offset,
  // a restart while data is held, empty, or more bytes than were free. The payload is at
  // offset(imm).
  absl::StatusOr<uint64_t> OnArrival(uint32_t imm, uint32_t length);
  static uint32_t offset(uint32_t imm) { return imm & ~kArenaRestartBit; }

  // The application is done with arrival `sequence`. kFailedPrecondition if it was never
  // delivered or is released twice.
  absl::Status Release(uint64_t sequence);

  // ---- Loans (on demand).
  enum class Loan : uint8_t {
    kNone,      // nothing lent
    kLent,      // lent: payloads may arrive
    kRecalled,  // recall sent: payloads posted before the writer saw it may still arrive
    kReturned,  // returned: nothing more arrives; the space goes back once all is released
  };
  // An ask arrived. kFailedPrecondition unless nothing is lent (or the last loan was returned)
  // and no ask waits already.
  absl::Status OnAsk();
  // An ask waits and the space is free: the caller may lend.
  bool Lendable() const { return ask_waiting_ && loan_state_ == Loan::kNone; }
  bool ask_waiting() const { return ask_waiting_; }
  // Lends (Lendable()): the new loan's number, for the lend message.
  uint32_t Lend();
  // Recalls the loan (kLent): the caller sends recall(loan()).
  void Recall();
  // A returned arrived: kFailedPrecondition unless it names the loan recalled.
  absl::Status OnReturned(uint32_t loan);
  // Returned and every payload released: the caller destroys the window, gives the space back
  // and calls Reclaimed.
  bool Reclaimable() const { return loan_state_ == Loan::kReturned && in_use() == 0; }
  void Reclaimed() { loan_state_ = Loan::kNone; }
  bool on_demand() const { return on_demand_; }
  Loan loan_state() const { return loan_state_; }
  uint32_t loan() const { return loan_; }

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
  bool on_demand_ = false;
  Loan loan_state_ = Loan::kNone;
  bool ask_waiting_ = false;
  uint32_t loan_ = 0;
  uint32_t expected_ = 0;        // the offset the writer's tail is at, by the ring rule
  uint32_t arrived_total_ = 0;   // bytes taken by arrivals (padding included), modulo 2^32
  uint32_t released_total_ = 0;  // bytes freed, modulo 2^32
  uint32_t reported_total_ = 0;
  uint64_t first_sequence_ = 0;  // sequence number of arrivals_.front()
  std::deque<Arrival> arrivals_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_ARENA_H_
