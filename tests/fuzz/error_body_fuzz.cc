// Fuzzes the error body codec (rpc/connection/rpc_header.h): DecodeErrorBody, which turns the body
// of a peer's error message into the status the caller sees, and EncodeErrorBody / ErrorBodySize,
// which cut a local status message (often quoting peer-controlled text) to fit a SEND.
//
// Input: [status code, u16 LE][kind selector, 1 B][limit, u64 LE][message: the rest]. A selector
// below 0x80 means kind error (the normal case); otherwise its low 7 bits are the kind, to see
// non-error headers refused. Short inputs read as zeros past their end.
//
// Checks, besides "no crash":
//  - DecodeErrorBody accepts exactly an error header with a non-OK code and a body of at most
//    kMaxErrorMessage bytes, and then reports that code with the body as its message;
//  - ErrorBodySize never exceeds min(limit, kMaxErrorMessage), and EncodeErrorBody writes
//    exactly that many bytes into a heap buffer of exactly that size (so ASan reports a write
//    past it);
//  - the body is the message itself when it fits; otherwise a prefix of it cut only inside a
//    character, followed by as much of kTruncatedMarker as fits, and still valid UTF-8 when the
//    message was;
//  - what EncodeErrorBody writes, sent after an error header, decodes back to the same message.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "rpc/connection/rpc_header.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/le.h"

namespace zrpc {
namespace {

constexpr size_t kPrefix = 11;            // code, selector, limit
constexpr uint64_t kLastStatusCode = 16;  // kUnauthenticated: absl's codes are 0..16

absl::string_view AsText(const uint8_t* bytes, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(bytes), size);
}

bool IsContinuation(char c) { return (static_cast<uint8_t>(c) & 0xc0) == 0x80; }

// Structural UTF-8: each lead byte followed by as many continuation bytes as it announces.
// (Overlong forms and surrogates pass; cutting a message cannot create either.)
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t lead = static_cast<uint8_t>(s[i]);
    size_t extra;
    if (lead < 0x80) {
      extra = 0;
    } else if ((lead & 0xe0) == 0xc0) {
      extra = 1;
    } else if ((lead & 0xf0) == 0xe0) {
      extra = 2;
    } else if ((lead & 0xf8) == 0xf0) {
      extra = 3;
    } else {
      return false;  // a stray continuation byte or an impossible lead
    }
    if (s.size() - i - 1 < extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      if (!IsContinuation(s[i + k])) return false;
    }
    i += extra + 1;
  }
  return true;
}

void CheckDecode(RpcKind kind, uint16_t code, absl::string_view body) {
  RpcHeader header = RpcHeader::Error(1, static_cast<absl::StatusCode>(code));
  header.kind = kind;
  absl::Status peer;
  const absl::Status s = DecodeErrorBody(
      header, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(body.data()), body.size()),
      &peer);
  const bool acceptable = kind == RpcKind::kError && code != 0 && body.size() <= kMaxErrorMessage;
  FUZZ_CHECK(s.ok() == acceptable);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    return;
  }
  FUZZ_CHECK(!peer.ok());
  // DecodeRpcHeader admits only absl's codes; for others absl::Status itself decides what
  // code() says, which is not this codec's business.
  if (code <= kLastStatusCode) {
    FUZZ_CHECK(peer.code() == static_cast<absl::StatusCode>(code));
    FUZZ_CHECK(peer.message() == body);
  }
}

// `written` is what EncodeErrorBody made of `message` with the effective limit `cap`.
void CheckCut(absl::string_view message, size_t cap, absl::string_view written) {
  if (message.size() <= cap) {
    FUZZ_CHECK(written == message);
    return;
  }
  const size_t marker = std::min(kTruncatedMarker.size(), cap);
  FUZZ_CHECK(written.size() >= marker);
  const size_t keep = written.size() - marker;
  FUZZ_CHECK(keep <= cap - marker);
  FUZZ_CHECK(written.substr(keep) == kTruncatedMarker.substr(0, marker));
  FUZZ_CHECK(written.substr(0, keep) == message.substr(0, keep));
  // The message could keep `room` bytes. The cut moves back from there only while message[room]
  // continues a character, to that character's first byte, so it never drops a whole character.
  const size_t room = cap - marker;
  if (keep < room) {
    for (size_t i = keep + 1; i <= room; ++i) FUZZ_CHECK(IsContinuation(message[i]));
  }
  FUZZ_CHECK(keep == 0 || !IsContinuation(message[keep]));
  if (IsUtf8(message)) {
    FUZZ_CHECK(IsUtf8(written));
    FUZZ_CHECK(room - keep <= 3);  // a character is at most 4 bytes
  }
}

// The body, as a peer receives it after an error header, reads back as the same text.
void CheckRoundTrip(absl::string_view written) {
  std::vector<uint8_t> wire(RpcHeader::kSize + written.size());
  EncodeRpcHeader(RpcHeader::Error(1, absl::StatusCode::kInternal), wire.data());
  std::copy(written.begin(), written.end(), wire.begin() + RpcHeader::kSize);
  const absl::StatusOr<RpcHeader> header = DecodeRpcHeader(wire);
  FUZZ_CHECK(header.ok());
  absl::Status peer;
  FUZZ_CHECK(
      DecodeErrorBody(*header, absl::MakeConstSpan(wire).subspan(RpcHeader::kSize), &peer).ok());
  FUZZ_CHECK(peer.code() == absl::StatusCode::kInternal);
  FUZZ_CHECK(peer.message() == written);
}

}  // namespace
}  // namespace zrpc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zrpc;  // NOLINT(build/namespaces): one function, many names
  uint8_t prefix[kPrefix] = {};
  std::copy(data, data + std::min(size, kPrefix), prefix);
  const uint16_t code = static_cast<uint16_t>(fuzz::ReadLe(prefix, 2));
  const RpcKind kind = prefix[2] < 0x80 ? RpcKind::kError : static_cast<RpcKind>(prefix[2] & 0x7f);
  const size_t limit = static_cast<size_t>(fuzz::ReadLe(prefix + 3, 8));
  const absl::string_view message =
      size > kPrefix ? AsText(data + kPrefix, size - kPrefix) : absl::string_view();

  CheckDecode(kind, code, message);

  const size_t cap = std::min(limit, kMaxErrorMessage);
  const size_t n = ErrorBodySize(message, limit);
  FUZZ_CHECK(n <= cap);
  // Exactly n bytes on the heap, so a write past the promised size is an ASan report.
  const std::unique_ptr<uint8_t[]> out(new uint8_t[n]);
  FUZZ_CHECK(EncodeErrorBody(message, out.get(), limit) == n);
  const absl::string_view written = AsText(out.get(), n);
  CheckCut(message, cap, written);
  CheckRoundTrip(written);
  return 0;
}
