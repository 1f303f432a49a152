// The receive-arena ring on the host: a writer and a reader run the same placement rule, the
// reader refuses every placement the rule does not allow, releases in any order free space in
// ring order, and payloads as large as the arena fit once it is empty.
#include "transport/arena.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <deque>
#include <vector>

namespace {
using zrpc::transport::ArenaReader;
using zrpc::transport::ArenaSpot;
using zrpc::transport::ArenaWriter;
using zrpc::transport::kArenaRestartBit;

// Writes `length` bytes: reserves on the writer, delivers to the reader, returns the sequence.
uint64_t Deliver(ArenaWriter& w, ArenaReader& r, uint32_t length, uint32_t* offset = nullptr) {
  auto spot = w.Reserve(length);
  REQUIRE(spot.ok());
  auto seq = r.OnArrival(spot->imm, length);
  INFO(seq.status());
  REQUIRE(seq.ok());
  if (offset != nullptr) *offset = spot->offset;
  return *seq;
}
}  // namespace

TEST_CASE("payloads are placed back to back, cache-line aligned", "[arena]") {
  ArenaWriter w(4096);
  ArenaReader r(4096);
  uint32_t a, b, c;
  Deliver(w, r, 1, &a);
  Deliver(w, r, 64, &b);
  Deliver(w, r, 65, &c);
  CHECK(a == 0);
  CHECK(b == 64);
  CHECK(c == 128);
  CHECK(w.in_use() == 256);
  CHECK(r.in_use() == 256);
}

TEST_CASE("a payload that cannot fit is refused, one that cannot fit yet waits", "[arena]") {
  ArenaWriter w(4096);
  CHECK(w.Reserve(0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(w.Reserve(4097).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(w.Reserve(4097).status().message().find("split") != absl::string_view::npos);
  ArenaWriter none(0);
  CHECK(none.Reserve(1).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(w.Reserve(4000).ok());
  CHECK(w.Reserve(128).status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(w.OnReleased(4032).ok());
  CHECK(w.Reserve(128).ok());
}

TEST_CASE("releases out of order free space only in ring order", "[arena]") {
  ArenaWriter w(1024);
  ArenaReader r(1024);
  uint64_t s0 = Deliver(w, r, 256);
  uint64_t s1 = Deliver(w, r, 256);
  uint64_t s2 = Deliver(w, r, 256);
  REQUIRE(r.Release(s1).ok());
  REQUIRE(r.Release(s2).ok());
  CHECK(r.released_total() == 0);  // s0 still holds the front of the ring
  CHECK_FALSE(r.ShouldReport());
  REQUIRE(r.Release(s0).ok());
  CHECK(r.released_total() == 768);
  CHECK(r.ShouldReport());
  CHECK(r.Release(s0).code() == absl::StatusCode::kFailedPrecondition);  // twice
  CHECK(r.Release(99).code() == absl::StatusCode::kFailedPrecondition);  // never delivered
  REQUIRE(w.OnReleased(r.released_total()).ok());
  r.MarkReported();
  CHECK_FALSE(r.ShouldReport());
  CHECK(w.in_use() == 0);
}

TEST_CASE("wrapping skips the end of the arena, and both sides count the padding", "[arena]") {
  ArenaWriter w(1024);
  ArenaReader r(1024);
  uint64_t s0 = Deliver(w, r, 512);
  uint64_t s1 = Deliver(w, r, 384);  // tail at 896
  REQUIRE(r.Release(s0).ok());
  REQUIRE(w.OnReleased(r.released_total()).ok());
  uint32_t offset = 1;
  uint64_t s2 = Deliver(w, r, 256, &offset);  // 128 bytes left at the end: wraps
  CHECK(offset == 0);
  CHECK(w.in_use() == 384 + 128 + 256);
  CHECK(r.in_use() == w.in_use());
  REQUIRE(r.Release(s1).ok());
  REQUIRE(r.Release(s2).ok());
  CHECK(r.in_use() == 0);
  REQUIRE(w.OnReleased(r.released_total()).ok());
  CHECK(w.in_use() == 0);
}

TEST_CASE("a payload as large as the arena fits whenever the arena is empty", "[arena]") {
  ArenaWriter w(4096);
  ArenaReader r(4096);
  uint64_t s0 = Deliver(w, r, 100);  // tail moves off 0
  REQUIRE(r.Release(s0).ok());
  CHECK(r.ShouldReport());  // empty arena: report even a small release
  CHECK(w.Reserve(4096).status().code() == absl::StatusCode::kUnavailable);  // not reported yet
  REQUIRE(w.OnReleased(r.released_total()).ok());
  r.MarkReported();
  auto spot = w.Reserve(4096);
  REQUIRE(spot.ok());
  CHECK(spot->offset == 0);
  CHECK((spot->imm & kArenaRestartBit) != 0);
  auto seq = r.OnArrival(spot->imm, 4096);
  REQUIRE(seq.ok());
  CHECK(r.in_use() == 4096);
}

TEST_CASE("the reader refuses placements the ring rule does not allow", "[arena]") {
  ArenaReader r(1024);
  SECTION("an offset other than the tail") {
    CHECK(r.OnArrival(64, 64).status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("an empty write, or one larger than the arena") {
    CHECK(!r.OnArrival(0, 0).ok());
    CHECK(!r.OnArrival(0, 1025).ok());
  }
  SECTION("more than is free") {
    REQUIRE(r.OnArrival(0, 1024).ok());
    CHECK(!r.OnArrival(0, 64).ok());
    CHECK(!r.OnArrival(kArenaRestartBit, 64).ok());  // a restart while data is held
  }
  SECTION("a wrap that was not needed") {
    REQUIRE(r.OnArrival(0, 64).ok());
    CHECK(!r.OnArrival(0, 64).ok());
  }
  SECTION("the reserved immediate bit") { CHECK(!r.OnArrival(1u << 30, 64).ok()); }
  SECTION("a refused arrival leaves the state as it was") {
    CHECK(!r.OnArrival(128, 64).ok());
    CHECK(r.OnArrival(0, 64).ok());
  }
}

TEST_CASE("the writer refuses a release report larger than what it wrote", "[arena]") {
  ArenaWriter w(1024);
  REQUIRE(w.Reserve(64).ok());
  CHECK(w.OnReleased(128).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(w.OnReleased(64).ok());
}

TEST_CASE("a long random run keeps writer and reader in agreement", "[arena]") {
  constexpr uint32_t kSize = 64 * 1024;
  ArenaWriter w(kSize);
  ArenaReader r(kSize);
  std::deque<uint64_t> held;
  uint64_t x = 0x243F6A8885A308D3ull;
  auto next = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  int placed = 0;
  for (int i = 0; i < 100000; ++i) {
    if (next() % 3 != 0) {
      uint32_t length = 1 + next() % (next() % 8 == 0 ? kSize : 3000);
      auto spot = w.Reserve(length);
      if (spot.ok()) {
        auto seq = r.OnArrival(spot->imm, length);
        REQUIRE(seq.ok());
        held.push_back(*seq);
        ++placed;
      } else {
        REQUIRE(spot.status().code() == absl::StatusCode::kUnavailable);
      }
    } else if (!held.empty()) {
      size_t pick = next() % held.size();  // release in random order
      REQUIRE(r.Release(held[pick]).ok());
      held.erase(held.begin() + pick);
      if (r.ShouldReport() || next() % 4 == 0) {
        REQUIRE(w.OnReleased(r.released_total()).ok());
        r.MarkReported();
      }
    }
    REQUIRE(r.in_use() <= kSize);
  }
  CHECK(placed > 10000);
}

TEST_CASE("an arena lent on demand: ask, lend, write, recall, returned, reclaim, again",
          "[arena]") {
  ArenaWriter w = ArenaWriter::OnDemand(1024);
  ArenaReader r = ArenaReader::OnDemand(1024);
  // Nothing lent: a payload that fits the loan's size waits, and one ask is due.
  CHECK(w.CheckFits(512).ok());
  CHECK_FALSE(w.TryReserve(512).has_value());
  CHECK(w.Reserve(512).status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(w.ShouldAsk());
  w.Asked();
  CHECK_FALSE(w.ShouldAsk());
  // A write into an arena not lent is refused.
  CHECK(r.OnArrival(0, 64).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(r.OnAsk().ok());
  CHECK(r.OnAsk().code() == absl::StatusCode::kFailedPrecondition);  // asked twice
  REQUIRE(r.Lendable());
  const uint32_t loan1 = r.Lend();
  CHECK(loan1 == 1);
  REQUIRE(w.OnLend(loan1, 1024).ok());
  uint64_t a = Deliver(w, r, 600);
  uint64_t b = Deliver(w, r, 300);
  // Recalled with payloads in it: the writer places nothing more; the two still arrive(d).
  r.Recall();
  REQUIRE(w.OnRecall(loan1).ok());
  CHECK_FALSE(w.TryReserve(64).has_value());
  CHECK(w.OnRecall(loan1).code() == absl::StatusCode::kFailedPrecondition);  // not held now
  REQUIRE(r.OnReturned(loan1).ok());
  // Returned: nothing more may arrive, and the space waits for its payloads' release.
  CHECK(r.OnArrival(0, 64).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(r.Reclaimable());
  REQUIRE(r.Release(b).ok());
  CHECK_FALSE(r.Reclaimable());
  REQUIRE(r.Release(a).ok());
  CHECK(r.Reclaimable());
  // The writer asks again at once, before the space is reclaimed: the ask waits for it.
  REQUIRE(w.ShouldAsk());
  w.Asked();
  REQUIRE(r.OnAsk().ok());
  CHECK_FALSE(r.Lendable());
  r.Reclaimed();
  REQUIRE(r.Lendable());
  // A lend before the writer heard of the releases is refused (its frame reports them first).
  const uint32_t loan2 = r.Lend();
  ArenaWriter early = w;
  CHECK(early.OnLend(loan2, 1024).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(w.OnReleased(r.released_total()).ok());
  REQUIRE(w.OnLend(loan2, 1024).ok());
  // The second loan starts its ring at offset 0 again.
  uint32_t offset = 99;
  Deliver(w, r, 64, &offset);
  CHECK(offset == 0);
}

TEST_CASE("loan messages that do not fit the state are protocol errors", "[arena]") {
  using zrpc::transport::ArenaReader;
  ArenaWriter w = ArenaWriter::OnDemand(1024);
  // A lend nobody asked for, of the wrong size, or an older loan's number.
  CHECK(w.OnLend(1, 1024).code() == absl::StatusCode::kFailedPrecondition);
  w.Asked();
  CHECK(w.OnLend(1, 2048).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(w.OnLend(3, 1024).ok());
  CHECK(w.OnLend(4, 1024).code() == absl::StatusCode::kFailedPrecondition);  // held already
  CHECK(w.OnRecall(2).code() == absl::StatusCode::kFailedPrecondition);      // another loan
  REQUIRE(w.OnRecall(3).ok());
  w.Asked();
  CHECK(w.OnLend(3, 1024).code() == absl::StatusCode::kFailedPrecondition);  // not above 3
  // A fixed arena lends nothing and is asked for nothing.
  ArenaWriter fixed(1024);
  CHECK_FALSE(fixed.ShouldAsk());
  CHECK(fixed.held());
  CHECK(fixed.OnLend(1, 1024).code() == absl::StatusCode::kFailedPrecondition);
  ArenaReader fixed_reader(1024);
  CHECK(fixed_reader.OnAsk().code() == absl::StatusCode::kFailedPrecondition);

  ArenaReader r = ArenaReader::OnDemand(1024);
  CHECK(r.OnReturned(1).code() == absl::StatusCode::kFailedPrecondition);  // nothing recalled
  REQUIRE(r.OnAsk().ok());
  const uint32_t loan = r.Lend();
  CHECK(r.OnAsk().code() == absl::StatusCode::kFailedPrecondition);  // asks while holding it
  CHECK(r.OnReturned(loan).code() == absl::StatusCode::kFailedPrecondition);  // not recalled
  r.Recall();
  CHECK(r.OnAsk().code() == absl::StatusCode::kFailedPrecondition);  // before returning it
  CHECK(r.OnReturned(loan + 1).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(r.OnReturned(loan).ok());
  CHECK(r.Reclaimable());  // nothing was written
}
