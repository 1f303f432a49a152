// Fuzzes DecodeFrameHeader (transport/wire.h): the 8 bytes at the start of every SEND a peer
// makes, decoded on the poller for each message before anything else looks at it.
//
// Checks, besides "no crash":
//  - it accepts exactly what wire.h allows (restated below from the table and the function's
//    comment): at least 8 bytes, kind data, credit, arena, park or parked, reserved byte zero,
//    and a credit update, park or parked frame with no payload;
//  - an accepted header re-encodes (EncodeFrameHeader) to the same 8 bytes, so every field was
//    read from its documented offset;
//  - a refusal is kFailedPrecondition, which the connection treats as a protocol violation.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/le.h"
#include "transport/wire.h"

namespace zrpc::transport {
namespace {

constexpr uint8_t kData = 1;
constexpr uint8_t kCredit = 2;
constexpr uint8_t kArena = 3;
constexpr uint8_t kPark = 4;
constexpr uint8_t kParked = 5;
constexpr uint8_t kAuth = 6;
constexpr uint8_t kAuthOk = 7;

bool Acceptable(const uint8_t* in, size_t size) {
  if (size < FrameHeader::kSize) return false;
  const uint8_t kind = in[6];
  if (kind != kData && kind != kCredit && kind != kArena && kind != kPark && kind != kParked &&
      kind != kAuth && kind != kAuthOk) {
    return false;
  }
  if (in[7] != 0) return false;
  // A credit update, park or parked frame is the header alone, an arena message 24 bytes more;
  // data carries any payload.
  if (kind == kCredit || kind == kPark || kind == kParked) return size == FrameHeader::kSize;
  if (kind == kArena) return size == FrameHeader::kSize + 24;
  // The authentication frames: a tag and an arena (44 bytes), an arena and a door (28).
  if (kind == kAuth) return size == FrameHeader::kSize + 44;
  if (kind == kAuthOk) return size == FrameHeader::kSize + 28;
  return true;
}

// The documented acceptance rule for an arena message (wire.h's table).
bool ArenaAcceptable(const uint8_t* in, size_t size) {
  if (size != 24) return false;
  if (in[0] < 1 || in[0] > 4) return false;
  if (in[1] != 0 || in[2] != 0 || in[3] != 0) return false;
  const uint64_t loan = zrpc::fuzz::ReadLe(in + 4, 4);
  const uint64_t addr = zrpc::fuzz::ReadLe(in + 8, 8);
  const uint64_t rkey = zrpc::fuzz::ReadLe(in + 16, 4);
  const uint64_t bytes = zrpc::fuzz::ReadLe(in + 20, 4);
  if ((in[0] == 1) != (loan == 0)) return false;  // an ask names no loan; the rest one
  if (in[0] != 2) return addr == 0 && rkey == 0 && bytes == 0;
  if (bytes == 0 || bytes % 64 != 0 || bytes > (1u << 30)) return false;
  return addr <= UINT64_MAX - bytes;
}

}  // namespace
}  // namespace zrpc::transport

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zrpc::transport;  // NOLINT(build/namespaces): one function, many names
  const absl::StatusOr<FrameHeader> header = DecodeFrameHeader(absl::MakeConstSpan(data, size));
  FUZZ_CHECK(header.ok() == Acceptable(data, size));
  // The same bytes past the header as an arena message, whatever the kind says.
  if (size >= FrameHeader::kSize) {
    const uint8_t* rest = data + FrameHeader::kSize;
    const size_t rest_size = size - FrameHeader::kSize;
    const absl::StatusOr<ArenaMessage> message =
        DecodeArenaMessage(absl::MakeConstSpan(rest, rest_size));
    FUZZ_CHECK(message.ok() == ArenaAcceptable(rest, rest_size));
    if (message.ok()) {
      uint8_t encoded[ArenaMessage::kSize];
      EncodeArenaMessage(*message, encoded);
      FUZZ_CHECK(std::memcmp(encoded, rest, ArenaMessage::kSize) == 0);
    } else {
      FUZZ_CHECK(message.status().code() == absl::StatusCode::kFailedPrecondition);
    }
  }
  if (!header.ok()) {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kFailedPrecondition);
    return 0;
  }
  FUZZ_CHECK(header->arena_released == zrpc::fuzz::ReadLe(data, 4));
  FUZZ_CHECK(header->credits == zrpc::fuzz::ReadLe(data + 4, 2));
  uint8_t encoded[FrameHeader::kSize];
  EncodeFrameHeader(*header, encoded);
  FUZZ_CHECK(std::memcmp(encoded, data, FrameHeader::kSize) == 0);
  return 0;
}
