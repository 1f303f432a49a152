// Fuzzes DecodeFrameHeader (transport/wire.h): the 8 bytes at the start of every SEND a peer
// makes, decoded on the poller for each message before anything else looks at it.
//
// Checks, besides "no crash":
//  - it accepts exactly what wire.h allows (restated below from the table and the function's
//    comment): at least 8 bytes, kind data or credit, reserved byte zero, and a credit update
//    with no payload;
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

bool Acceptable(const uint8_t* in, size_t size) {
  if (size < FrameHeader::kSize) return false;
  const uint8_t kind = in[6];
  if (kind != kData && kind != kCredit) return false;
  if (in[7] != 0) return false;
  // A credit update is the header alone; only data frames carry a payload.
  return kind == kData || size == FrameHeader::kSize;
}

}  // namespace
}  // namespace zrpc::transport

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zrpc::transport;  // NOLINT(build/namespaces): one function, many names
  const absl::StatusOr<FrameHeader> header = DecodeFrameHeader(absl::MakeConstSpan(data, size));
  FUZZ_CHECK(header.ok() == Acceptable(data, size));
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
