// Fuzzes DecodeHello (transport/wire.h): the 36 bytes a peer puts in the private data of its
// connect request or accept reply, parsed before this side trusts the peer with anything.
//
// "No crash" alone would miss the bugs that matter here, a rule dropped or loosened by mistake,
// so the target also checks that
//  - DecodeHello accepts exactly the inputs that wire.h's table and DecodeHello's comment allow
//    (restated below from the documentation, not from wire.cc);
//  - every Hello it accepts obeys the bounds the transport relies on afterwards: credits in
//    [kMinCredits, kMaxCredits] and a window that may reach at most kMaxCredits, a RECV that holds
//    a frame header, an arena that is a multiple of kArenaAlign, at most kMaxArenaSize, and does
//    not wrap the address space;
//  - an accepted Hello re-encodes (EncodeHello) to the same 36 bytes, so no field is lost;
//  - bytes past the 36 change nothing, as wire.h promises later versions;
//  - a refusal is kFailedPrecondition with the "zrpc handshake: " prefix the user sees.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/le.h"
#include "transport/arena.h"
#include "transport/credits.h"
#include "transport/wire.h"

namespace zrpc::transport {
namespace {

using fuzz::ReadLe;

// The documented acceptance rule for a Hello, field by field (offsets from wire.h's table).
bool Acceptable(const uint8_t* in, size_t size) {
  if (size < Hello::kSize) return false;
  if (ReadLe(in + 0, 4) != kWireMagic) return false;
  if (ReadLe(in + 4, 2) != kWireVersion) return false;
  const uint64_t flags = ReadLe(in + 6, 2);
  // Bits 0, 1 and 2 alone are defined.
  if ((flags & ~uint64_t{kHelloArenaOnDemand | kHelloParks | kHelloAuth}) != 0) return false;
  const uint64_t credits = ReadLe(in + 8, 4);
  // No credit is a parked start, which only a Hello that parks may offer; one is the provisional
  // window of a side that authenticates.
  const bool parked = credits == 0 && (flags & kHelloParks) != 0;
  const bool provisional = credits == 1 && (flags & kHelloAuth) != 0;
  if (!parked && !provisional && (credits < kMinCredits || credits > kMaxCredits)) return false;
  const uint64_t max_credits = ReadLe(in + 32, 4);
  if (max_credits < std::max<uint64_t>(credits, kMinCredits) || max_credits > kMaxCredits) {
    return false;
  }
  if (ReadLe(in + 12, 4) < FrameHeader::kSize) return false;
  const uint64_t addr = ReadLe(in + 16, 8);
  const uint64_t arena_size = ReadLe(in + 28, 4);
  if (arena_size % kArenaAlign != 0 || arena_size > kMaxArenaSize) return false;
  // An arena must end inside the 64-bit address space: its end addr + size fits in a uint64_t.
  if (arena_size > 0 && addr > UINT64_MAX - arena_size) return false;
  // An arena lent on demand has a size and no address or key yet.
  if ((flags & kHelloArenaOnDemand) != 0 &&
      (arena_size == 0 || addr != 0 || ReadLe(in + 24, 4) != 0)) {
    return false;
  }
  // A side that authenticates gives its arena's address and key only after the tags.
  if ((flags & kHelloAuth) != 0 && (addr != 0 || ReadLe(in + 24, 4) != 0)) return false;
  return true;
}

void CheckBounds(const Hello& h) {
  FUZZ_CHECK(h.version == kWireVersion);
  FUZZ_CHECK((h.flags & ~(kHelloArenaOnDemand | kHelloParks | kHelloAuth)) == 0);
  FUZZ_CHECK((h.flags & kHelloAuth) == 0 || (h.arena_addr == 0 && h.arena_rkey == 0));
  FUZZ_CHECK((h.flags & kHelloArenaOnDemand) == 0 ||
             (h.arena_size > 0 && h.arena_addr == 0 && h.arena_rkey == 0));
  FUZZ_CHECK((h.recv_credits == 0 && (h.flags & kHelloParks) != 0) ||
             (h.recv_credits == 1 && (h.flags & kHelloAuth) != 0) ||
             (h.recv_credits >= kMinCredits && h.recv_credits <= kMaxCredits));
  FUZZ_CHECK(h.max_recv_credits >= std::max(h.recv_credits, kMinCredits) &&
             h.max_recv_credits <= kMaxCredits);
  FUZZ_CHECK(h.recv_size >= FrameHeader::kSize);
  FUZZ_CHECK(h.arena_size % kArenaAlign == 0);
  FUZZ_CHECK(h.arena_size <= kMaxArenaSize);
  FUZZ_CHECK(h.arena_size == 0 || h.arena_addr <= UINT64_MAX - h.arena_size);
}

}  // namespace
}  // namespace zrpc::transport

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zrpc::transport;  // NOLINT(build/namespaces): one function, many names
  const absl::StatusOr<Hello> hello = DecodeHello(absl::MakeConstSpan(data, size));
  FUZZ_CHECK(hello.ok() == Acceptable(data, size));
  if (!hello.ok()) {
    FUZZ_CHECK(hello.status().code() == absl::StatusCode::kFailedPrecondition);
    FUZZ_CHECK(absl::StartsWith(hello.status().message(), "zrpc handshake: "));
  } else {
    CheckBounds(*hello);
    uint8_t encoded[Hello::kSize];
    EncodeHello(*hello, encoded);
    FUZZ_CHECK(std::memcmp(encoded, data, Hello::kSize) == 0);
  }
  if (size > Hello::kSize) {
    const absl::StatusOr<Hello> first = DecodeHello(absl::MakeConstSpan(data, Hello::kSize));
    FUZZ_CHECK(first.ok() == hello.ok());
    FUZZ_CHECK(!first.ok() || *first == *hello);
  }
  return 0;
}
