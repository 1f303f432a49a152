// Fuzzes DecodeRpcHeader (rpc/connection/rpc_header.h): the 32-byte header of every RPC message a
// peer sends, then DecodeLayout (a metadata block off the front, a large body's trailer, pull
// descriptors), DecodeMetadataBlock on the block's entries, and, for what decodes as an error,
// DecodeErrorBody on the message after the block. The input is one whole transport payload:
// header, then body.
//
// Checks, besides "no crash":
//  - it accepts exactly the headers rpc/WIRE.md allows ("What a receiver checks"), restated
//    below field by field from that page rather than from rpc_header.cc;
//  - an accepted header re-encodes (EncodeRpcHeader) to the same 32 bytes;
//  - an accepted error's body always decodes (the header check already bounded it), giving the
//    header's code and the body's bytes as the message; for any other kind DecodeErrorBody
//    refuses;
//  - a refusal is kFailedPrecondition, which the runtime answers by disconnecting.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "rpc/connection/rpc_header.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/le.h"

namespace zrpc {
namespace {

using fuzz::ReadLe;

constexpr uint8_t kRequest = 1, kResponse = 2, kError = 3, kCancel = 4, kPulled = 5;
constexpr uint8_t kStreamMessage = 6, kHalfClose = 7, kStreamCredit = 8;
constexpr uint8_t kPullFlag = 0x02, kPullResponseFlag = 0x04, kLargeBodyFlag = 0x08;
constexpr uint8_t kStreamFlag = 0x10, kMetadataFlag = 0x20;
constexpr size_t kMaxEntries = 3072;      // Metadata::kMaxSize
constexpr uint64_t kLastStatusCode = 16;  // kUnauthenticated: absl's codes are 0..16

bool Acceptable(const uint8_t* in, size_t size) {
  if (size < RpcHeader::kSize) return false;
  const size_t body = size - RpcHeader::kSize;
  const uint8_t kind = in[0];
  const uint8_t flags = in[1];
  const uint64_t method = ReadLe(in + 2, 2), service = ReadLe(in + 4, 4);
  const uint64_t call_id = ReadLe(in + 8, 8), timeout = ReadLe(in + 16, 8);
  const uint64_t bulk_size = ReadLe(in + 24, 4), status = ReadLe(in + 28, 2);
  const uint64_t window = ReadLe(in + 30, 2);
  if (kind < kRequest || kind > kStreamCredit) return false;
  if ((flags & ~(kRpcFlagBulk | kPullFlag | kPullResponseFlag | kLargeBodyFlag | kStreamFlag |
                 kMetadataFlag)) != 0) {
    return false;
  }
  // Metadata on requests, responses and errors only.
  const bool metadata = (flags & kMetadataFlag) != 0;
  if (metadata && kind != kRequest && kind != kResponse && kind != kError) return false;
  // A window exactly in stream opens and credits, and never 0 there.
  const bool grants = (kind == kRequest && (flags & kStreamFlag) != 0) || kind == kStreamCredit;
  if (grants != (window != 0)) return false;
  if (kind != kRequest && (flags & (kPullResponseFlag | kStreamFlag)) != 0) return false;
  if (call_id == 0 || status > kLastStatusCode) return false;
  // Only a request names a method and carries a deadline; a pulled carries an address there.
  if (kind != kRequest && (service != 0 || method != 0)) return false;
  if (kind != kRequest && kind != kPulled && timeout != 0) return false;
  const bool bulk_flag = (flags & kRpcFlagBulk) != 0;
  const bool pull_flag = (flags & kPullFlag) != 0;
  if (kind == kRequest || kind == kResponse || kind == kStreamMessage) {
    if (bulk_flag != (bulk_size != 0)) return false;
    // A pulled payload: with the bulk flag, and a body that holds the 16-byte descriptor.
    if (pull_flag && (!bulk_flag || body < 16)) return false;
    // A large body: with the bulk flag, and a body that holds the 8-byte trailer.
    if ((flags & kLargeBodyFlag) != 0 && (!bulk_flag || body < 8)) return false;
  } else if ((flags & ~kMetadataFlag) != 0 || bulk_size != 0) {
    return false;
  }
  if (kind == kError) {
    // The message after a block is checked once the block is off (below); the whole body here.
    const size_t block = metadata ? 4 + kMaxEntries : 0;
    if (status == 0 || body > kMaxErrorMessage + block) return false;
  } else if (status != 0) {
    return false;
  }
  return (kind != kCancel && kind != kPulled && kind != kHalfClose && kind != kStreamCredit) ||
         body == 0;
}

// DecodeLayout on an accepted request or response, restated from WIRE.md: with a large body,
// the body is exactly the trailer (a size in 1..bulk_size, 4 zero bytes) and then one
// descriptor when pulled, two when the body is smaller than the payload; without, the
// descriptor ends the body. A descriptor's last 4 bytes (its flags) are 0 or 1 (kPullWindow), and
// a message's two descriptors carry the same.
// A metadata block first, when flagged: a 4-byte size of 1..3,072 within the body, and after it
// at least the large body's 8-byte trailer when there is one.
bool LayoutAcceptable(const uint8_t* in, size_t size) {
  const uint8_t flags = in[1];
  const uint64_t bulk_size = ReadLe(in + 24, 4);
  const uint8_t* body = in + RpcHeader::kSize;
  size_t length = size - RpcHeader::kSize;
  const bool large = (flags & kLargeBodyFlag) != 0;
  if ((flags & kMetadataFlag) != 0) {
    if (length < 4) return false;
    const uint64_t entries = ReadLe(body, 4);
    if (entries == 0 || entries > kMaxEntries || entries > length - 4) return false;
    body += 4 + entries;
    length -= 4 + entries;
    if (large && length < 8) return false;
  }
  size_t descriptors = (flags & kPullFlag) != 0 ? 1 : 0;
  size_t trailer = 0;
  if (large) {
    const uint64_t body_size = ReadLe(body, 4);
    if (ReadLe(body + 4, 4) != 0 || body_size == 0 || body_size > bulk_size) return false;
    if (descriptors == 1 && body_size < bulk_size) descriptors = 2;
    trailer = 8;
  }
  trailer += 16 * descriptors;
  if (large ? length != trailer : length < trailer) return false;
  uint64_t first_flags = 0;
  for (size_t i = 0; i < descriptors; ++i) {
    const uint64_t descriptor_flags = ReadLe(body + length - 16 * (descriptors - i) + 12, 4);
    if (descriptor_flags > 1) return false;
    if (i == 0) first_flags = descriptor_flags;
    if (descriptor_flags != first_flags) return false;
  }
  return true;
}

}  // namespace
}  // namespace zrpc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zrpc;  // NOLINT(build/namespaces): one function, many names
  const absl::StatusOr<RpcHeader> header = DecodeRpcHeader(absl::MakeConstSpan(data, size));
  FUZZ_CHECK(header.ok() == Acceptable(data, size));
  if (!header.ok()) {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kFailedPrecondition);
    return 0;
  }
  uint8_t encoded[RpcHeader::kSize];
  EncodeRpcHeader(*header, encoded);
  FUZZ_CHECK(std::memcmp(encoded, data, RpcHeader::kSize) == 0);

  // The runtime lays out every message it accepts (Receive).
  const absl::StatusOr<MessageLayout> layout =
      DecodeLayout(*header, absl::MakeConstSpan(data, size));
  FUZZ_CHECK(layout.ok() == LayoutAcceptable(data, size));
  if (layout.ok() && !layout->metadata.empty()) {
    // Whatever the entries say, they decode or are refused as a violation; never more than the
    // block's bytes are kept.
    Metadata metadata;
    absl::Status error = absl::UnknownError("e");
    const absl::Status entries = DecodeMetadataBlock(
        layout->metadata, &metadata, header->kind == RpcKind::kError ? &error : nullptr);
    FUZZ_CHECK(entries.ok() || entries.code() == absl::StatusCode::kFailedPrecondition);
    if (entries.ok()) FUZZ_CHECK(metadata.encoded_size() <= layout->metadata.size());
  }
  if (header->kind == RpcKind::kRequest || header->kind == RpcKind::kResponse ||
      header->kind == RpcKind::kStreamMessage) {
    if (layout.ok()) {
      FUZZ_CHECK(layout->bulk_size(*header) <= header->bulk_size);
      FUZZ_CHECK(layout->body.size() + RpcHeader::kSize <= size);
      // Invalidated on kPulled exactly when the first descriptor is a window's, with its key.
      FUZZ_CHECK(layout->invalidate_rkey ==
                 (layout->pull_count > 0 && (layout->pulls[0].flags & kPullWindow) != 0
                      ? layout->pulls[0].rkey
                      : 0));
    }
  }
  if (!layout.ok()) return 0;
  const absl::Span<const uint8_t> body = layout->body;
  absl::Status peer;
  const absl::Status decoded = DecodeErrorBody(*header, body, &peer);
  if (header->kind != RpcKind::kError) {
    FUZZ_CHECK(decoded.code() == absl::StatusCode::kFailedPrecondition);
    return 0;
  }
  // The message after the block: within the bound, or refused (the block took less room).
  FUZZ_CHECK(decoded.ok() == (body.size() <= kMaxErrorMessage));
  if (!decoded.ok()) return 0;
  FUZZ_CHECK(peer.code() == header->status_code);
  FUZZ_CHECK(peer.message() ==
             absl::string_view(reinterpret_cast<const char*>(body.data()), body.size()));
  return 0;
}
