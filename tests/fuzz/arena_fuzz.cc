// Fuzzes the receive arena (transport/arena.h). ArenaReader::OnArrival takes the immediate and
// length of a peer's bulk WRITE, both chosen by the peer, and says where the payload is: were it
// to accept a placement past the arena's end or over a payload the application still holds, a
// peer could make this side read corrupted data. ArenaWriter::OnReleased takes the peer's
// arena_released counter from every frame it sends.
//
// The input is a program. Byte 0 picks the arena size, (b % 65) * kArenaAlign: 0 to 4 KiB, small
// so that a run wraps the ring often. Then each operation is an opcode byte (modulo kNumOps) and
// its operands, little-endian; reads past the end give 0.
//   kArrive      imm u32, length u32  a WRITE_WITH_IMM the peer made up
//   kWrite       length u16           an honest peer's WRITE: ArenaWriter::Reserve, delivered
//   kRelease     k u8                 the application releases the k-th payload not yet freed
//                                     (past the last: one never delivered)
//   kReleaseAny  sequence u64         a release of any sequence number
//   kReport      -                    released_total() reaches the writer in a frame
//   kClaim       total u32            a frame with a made-up arena_released reaches the writer
//
// A model beside the reader keeps the accepted payloads not yet freed (the FIFO of arena.h) and
// the ring's tail, and checks after every step that
//  - an accepted payload lies inside the arena, aligned, and overlaps no payload still held;
//  - the reader accepts exactly the placements the ring rule of arena.h allows (restated in
//    RingPlacement from that description), and counts in_use() and released_total() as the
//    model does, padding included. (Only until the reader first refuses an arrival: a real
//    connection closes then, so the reader's state after a refusal is unspecified; the safety
//    checks go on regardless.)
//  - a release succeeds exactly when its sequence was delivered and not released before;
//  - in_use() is at most the arena, covers every held payload, and is 0 when none is held;
//  - an emptied arena with unreported releases asks for a report (ShouldReport);
//  - while only honest operations happened, writer and reader agree: the reader accepts every
//    placement the writer makes, at the writer's offset; their views of the space in use differ
//    by exactly the released bytes not yet reported; and once everything is released and
//    reported, any payload that fits the arena is placeable;
//  - the writer accepts a made-up release counter exactly when it frees no more than is in use.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/le.h"
#include "transport/arena.h"

namespace zrpc::transport {
namespace {

enum Op : uint8_t { kArrive, kWrite, kRelease, kReleaseAny, kReport, kClaim, kNumOps };

// The input read front to back, so that seeds are easy to write by hand (tests/fuzz/make_seeds.py).
class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint64_t Next(size_t width) {
    uint8_t bytes[8] = {};
    for (size_t i = 0; i < width && pos_ < size_; ++i) bytes[i] = data_[pos_++];
    return fuzz::ReadLe(bytes, width);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The space a payload of `length` bytes occupies (64 bits: no wrap for lengths near 2^32).
uint64_t Rounded(uint32_t length) {
  return (uint64_t{length} + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

// A payload the reader accepted and has not freed yet.
struct Held {
  uint64_t sequence;
  uint32_t offset;
  uint64_t rounded;
  uint64_t need;  // rounded plus the padding skipped before it: what its release frees
  bool released;  // by the application; its space waits for the payloads before it
};

// Where the ring rule puts a payload, and the space it takes.
struct Placement {
  uint32_t offset;
  uint64_t need;
};

class Harness {
 public:
  explicit Harness(uint32_t size) : size_(size), reader_(size), writer_(size) {}

  void Arrive(uint32_t imm, uint32_t length) {
    in_sync_ = false;  // the writer did not place this one
    Deliver(imm, length);
  }

  void Write(uint32_t length) {
    const bool fits = size_ > 0 && length > 0 && Rounded(length) <= size_;
    FUZZ_CHECK(writer_.CheckFits(length).ok() == fits);
    const absl::StatusOr<ArenaSpot> spot = writer_.Reserve(length);
    if (!spot.ok()) {
      FUZZ_CHECK(spot.status().code() ==
                 (fits ? absl::StatusCode::kUnavailable : absl::StatusCode::kInvalidArgument));
      // The exception arena.h makes for an empty arena: nothing that fits waits for ever.
      FUZZ_CHECK(!(in_sync_ && fits && writer_.in_use() == 0));
      return;
    }
    FUZZ_CHECK(fits);
    const bool accepted = Deliver(spot->imm, length);
    if (in_sync_) {
      FUZZ_CHECK(accepted);
      FUZZ_CHECK(held_.back().offset == spot->offset);
    }
  }

  void ReleaseNth(uint8_t k) { Release(FirstHeld() + k); }

  void Release(uint64_t sequence) {
    const uint64_t first = FirstHeld();
    const bool valid =
        sequence >= first && sequence < next_sequence_ && !held_[sequence - first].released;
    const absl::Status s = reader_.Release(sequence);
    FUZZ_CHECK(s.ok() == valid);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
      return;
    }
    held_[sequence - first].released = true;
    while (!held_.empty() && held_.front().released) {
      released_ += static_cast<uint32_t>(held_.front().need);
      held_.pop_front();
    }
  }

  void Report() {
    const uint32_t total = reader_.released_total();
    const absl::Status s = writer_.OnReleased(total);
    FUZZ_CHECK(s.ok() || !in_sync_);
    if (s.ok()) writer_released_ = total;
    reader_.MarkReported();
    reader_reported_ = total;
    FUZZ_CHECK(!reader_.ShouldReport());
  }

  void Claim(uint32_t total) {
    const uint32_t newly = total - writer_released_;  // modulo 2^32, as the counter is
    const uint32_t before = writer_.in_use();
    const absl::Status s = writer_.OnReleased(total);
    FUZZ_CHECK(s.ok() == (newly <= before));
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
      return;
    }
    FUZZ_CHECK(writer_.in_use() == before - newly);
    writer_released_ = total;
    if (total != reader_.released_total()) in_sync_ = false;
  }

  void CheckInvariants() const {
    uint64_t held_bytes = 0;
    for (const Held& h : held_) held_bytes += h.rounded;
    FUZZ_CHECK(reader_.in_use() <= size_);
    FUZZ_CHECK(reader_.in_use() >= held_bytes);
    FUZZ_CHECK(!held_.empty() || reader_.in_use() == 0);
    if (exact_) {
      FUZZ_CHECK(reader_.in_use() == InUse());
      FUZZ_CHECK(reader_.released_total() == released_);
    }
    FUZZ_CHECK(writer_.in_use() <= size_);
    if (reader_.in_use() == 0 && reader_.released_total() != reader_reported_) {
      FUZZ_CHECK(reader_.ShouldReport());
    }
    if (in_sync_) {
      FUZZ_CHECK(writer_.in_use() - reader_.in_use() ==
                 reader_.released_total() - writer_released_);
    }
  }

 private:
  uint64_t FirstHeld() const { return held_.empty() ? next_sequence_ : held_.front().sequence; }

  // Bytes the model holds: payloads not freed and the padding before each.
  uint64_t InUse() const {
    uint64_t bytes = 0;
    for (const Held& h : held_) bytes += h.need;
    return bytes;
  }

  // The ring rule of arena.h, from its description: a payload goes at the tail, or at offset 0
  // after padding to the end when it does not fit before the end; a restart (allowed only while
  // nothing is held) moves the tail to 0 first. nullopt when the arena has no room for it.
  std::optional<Placement> RingPlacement(bool restart, uint32_t length) const {
    const uint64_t rounded = Rounded(length);
    if (length == 0 || rounded > size_) return std::nullopt;
    const uint64_t in_use = InUse();
    if (restart && in_use != 0) return std::nullopt;
    const uint64_t tail = restart ? 0 : tail_;
    Placement p{static_cast<uint32_t>(tail), rounded};
    if (tail + rounded > size_) p = Placement{0, rounded + (size_ - tail)};
    if (in_use + p.need > size_) return std::nullopt;
    return p;
  }

  // Hands a WRITE to the reader; on acceptance checks the placement and records it.
  bool Deliver(uint32_t imm, uint32_t length) {
    const uint32_t offset = ArenaReader::offset(imm);
    const std::optional<Placement> rule = RingPlacement((imm & kArenaRestartBit) != 0, length);
    const absl::StatusOr<uint64_t> sequence = reader_.OnArrival(imm, length);
    if (exact_) FUZZ_CHECK(sequence.ok() == (rule.has_value() && rule->offset == offset));
    if (!sequence.ok()) {
      FUZZ_CHECK(sequence.status().code() == absl::StatusCode::kFailedPrecondition);
      exact_ = false;
      return false;
    }
    FUZZ_CHECK(*sequence == next_sequence_);
    const uint64_t rounded = Rounded(length);
    FUZZ_CHECK(length > 0);
    FUZZ_CHECK(offset % kArenaAlign == 0);
    FUZZ_CHECK(offset + rounded <= size_);
    for (const Held& h : held_) {
      FUZZ_CHECK(offset + rounded <= h.offset || h.offset + h.rounded <= offset);
    }
    // Outside exact mode the model cannot say how much padding the reader counted; the payload
    // alone is the least it holds.
    const uint64_t need = exact_ ? rule->need : rounded;
    held_.push_back(Held{next_sequence_++, offset, rounded, need, false});
    tail_ = offset + rounded;
    return true;
  }

  const uint32_t size_;
  ArenaReader reader_;
  ArenaWriter writer_;
  std::deque<Held> held_;  // in arrival order, so sequences are consecutive
  uint64_t next_sequence_ = 0;
  uint64_t tail_ = 0;      // where the ring rule puts the next payload
  uint32_t released_ = 0;  // bytes the model freed, modulo 2^32 like released_total()
  // True until the reader first refuses an arrival (see the top of the file).
  bool exact_ = true;
  uint32_t writer_released_ = 0;  // the last counter the writer accepted
  uint32_t reader_reported_ = 0;  // the last counter the reader was told went out
  // True while the writer has seen only what an honest peer's frames carry.
  bool in_sync_ = true;
};

}  // namespace
}  // namespace zrpc::transport

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zrpc::transport;  // NOLINT(build/namespaces): one function, many names
  Program program(data, size);
  Harness harness(static_cast<uint32_t>(program.Next(1) % 65) * kArenaAlign);
  while (!program.done()) {
    switch (program.Next(1) % kNumOps) {
      case kArrive: {
        const uint32_t imm = static_cast<uint32_t>(program.Next(4));
        const uint32_t length = static_cast<uint32_t>(program.Next(4));
        harness.Arrive(imm, length);
        break;
      }
      case kWrite:
        harness.Write(static_cast<uint32_t>(program.Next(2)));
        break;
      case kRelease:
        harness.ReleaseNth(static_cast<uint8_t>(program.Next(1)));
        break;
      case kReleaseAny:
        harness.Release(program.Next(8));
        break;
      case kReport:
        harness.Report();
        break;
      case kClaim:
        harness.Claim(static_cast<uint32_t>(program.Next(4)));
        break;
    }
    harness.CheckInvariants();
  }
  return 0;
}
