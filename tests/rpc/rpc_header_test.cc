// The RPC header codec, on the host: round trips of every kind, exact bytes, and every malformed
// header a peer could send refused by name, without reading past what it was given.
#include "rpc/connection/rpc_header.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using zrpc::DecodeErrorBody;
using zrpc::DecodeRpcHeader;
using zrpc::EncodeErrorBody;
using zrpc::EncodeRpcHeader;
using zrpc::ErrorBodySize;
using zrpc::kMaxErrorMessage;
using zrpc::kTruncatedMarker;
using zrpc::RpcHeader;
using zrpc::RpcKind;

constexpr uint64_t kId = 0x0000'0123'4500'0007;

// A message: the header, then `body` bytes of 0xab.
std::vector<uint8_t> Message(const RpcHeader& h, size_t body = 0) {
  std::vector<uint8_t> bytes(RpcHeader::kSize + body, 0xab);
  EncodeRpcHeader(h, bytes.data());
  return bytes;
}

// The decoder refuses `bytes` with kFailedPrecondition naming `field`.
bool Refused(const std::vector<uint8_t>& bytes, const std::string& field) {
  absl::StatusOr<RpcHeader> decoded = DecodeRpcHeader(bytes);
  if (decoded.ok()) return false;
  INFO(decoded.status());
  return decoded.status().code() == absl::StatusCode::kFailedPrecondition &&
         decoded.status().message().find("rpc header: " + field + " ") != absl::string_view::npos;
}

std::vector<RpcHeader> OneOfEachKind() {
  return {
      RpcHeader::Request(zrpc::ServiceId("zrpc.test.Echo"), 3, kId, 250'000),
      RpcHeader::Request(0xffff'ffff, 0xffff, ~uint64_t{0}, ~uint64_t{0}, 0xffff'ffff),
      RpcHeader::Response(kId),
      RpcHeader::Response(kId, 1 << 20),
      RpcHeader::Error(kId, absl::StatusCode::kNotFound),
      RpcHeader::Error(kId, absl::StatusCode::kUnauthenticated),
      RpcHeader::Cancel(kId),
      RpcHeader::Pulled(kId, 0),
      RpcHeader::Pulled(kId, ~uint64_t{0}),
      RpcHeader::StreamOpen(zrpc::ServiceId("zrpc.test.Echo"), 2, kId, 0, 0xffff),
      RpcHeader::StreamMessage(kId),
      RpcHeader::HalfClose(kId),
      RpcHeader::StreamCredit(~uint64_t{0}, 1),
  };
}

// Kinds whose body must be empty.
bool HeaderOnly(RpcKind kind) {
  return kind == RpcKind::kCancel || kind == RpcKind::kPulled || kind == RpcKind::kHalfClose ||
         kind == RpcKind::kStreamCredit;
}

// FNV-1a 32, written independently of rpc_header.h: 64-bit arithmetic, masked.
uint32_t Fnv1a(const std::string& s) {
  uint64_t h = 0x811c9dc5;
  for (unsigned char c : s) h = ((h ^ c) * 0x01000193) & 0xffffffff;
  return static_cast<uint32_t>(h);
}

}  // namespace

TEST_CASE("every kind survives encode and decode, with bodies it may carry", "[rpc_header]") {
  for (const RpcHeader& h : OneOfEachKind()) {
    const size_t body = HeaderOnly(h.kind)          ? 0
                        : h.kind == RpcKind::kError ? kMaxErrorMessage
                                                    : 4000;
    std::vector<uint8_t> bytes = Message(h, body);
    absl::StatusOr<RpcHeader> decoded = DecodeRpcHeader(bytes);
    INFO(static_cast<int>(h.kind));
    REQUIRE(decoded.ok());
    CHECK(*decoded == h);
    CHECK(decoded->has_bulk() == (h.bulk_size > 0));
    std::vector<uint8_t> again(RpcHeader::kSize);
    EncodeRpcHeader(*decoded, again.data());
    CHECK(std::equal(again.begin(), again.end(), bytes.begin()));
  }
}

TEST_CASE("a request's bytes are the documented little-endian layout", "[rpc_header]") {
  RpcHeader h =
      RpcHeader::Request(0x11223344, 0x5566, 0x0102030405060708, 0x1122334455667788, 0x99aabbcc);
  const std::vector<uint8_t> expected = {
      0x01,                                            // kind: request
      0x01,                                            // flags: bulk
      0x66, 0x55,                                      // method_index
      0x44, 0x33, 0x22, 0x11,                          // service_id
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // call_id
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // timeout_us
      0xcc, 0xbb, 0xaa, 0x99,                          // bulk_size
      0x00, 0x00,                                      // status_code
      0x00, 0x00,                                      // reserved
  };
  CHECK(Message(h) == expected);
  std::vector<uint8_t> error = Message(RpcHeader::Error(1, absl::StatusCode::kDataLoss));
  CHECK(error[0] == 3);
  CHECK(error[28] == 15);  // kDataLoss
  CHECK(error[29] == 0);
}

TEST_CASE("every truncated header is refused", "[rpc_header]") {
  for (const RpcHeader& h : OneOfEachKind()) {
    std::vector<uint8_t> bytes = Message(h);
    for (size_t n = 0; n < RpcHeader::kSize; ++n) {
      INFO(n);
      CHECK(Refused(std::vector<uint8_t>(bytes.begin(), bytes.begin() + n), "length"));
    }
  }
}

TEST_CASE("each invalid field is refused with its name", "[rpc_header]") {
  const RpcHeader request = RpcHeader::Request(7, 1, kId, 1000);
  const RpcHeader response = RpcHeader::Response(kId);
  const RpcHeader error = RpcHeader::Error(kId, absl::StatusCode::kInternal);
  const RpcHeader cancel = RpcHeader::Cancel(kId);
  const RpcHeader pulled = RpcHeader::Pulled(kId, 0);
  const RpcHeader open = RpcHeader::StreamOpen(7, 1, kId, 0, 16);
  const RpcHeader message = RpcHeader::StreamMessage(kId);
  const RpcHeader half_close = RpcHeader::HalfClose(kId);
  const RpcHeader credit = RpcHeader::StreamCredit(kId, 8);
  struct Case {
    const char* what;
    RpcHeader base;
    size_t offset;
    uint8_t value;
    const char* field;
  };
  const Case cases[] = {
      {"kind 0", request, 0, 0, "kind"},
      {"kind 9 (reserved)", request, 0, 9, "kind"},
      {"kind 255", request, 0, 255, "kind"},
      {"unknown flag bit", request, 1, 0x40, "flags"},
      {"metadata flag on a cancel", cancel, 1, 0x20, "flags"},
      {"stream flag in a response", response, 1, 0x10, "flags"},
      {"stream flag in a stream message", message, 1, 0x10, "flags"},
      {"stream flag in a credit", credit, 1, 0x10, "flags"},
      {"stream flag without a window", request, 1, 0x10, "window"},
      {"a stream open without a window", open, 30, 0, "window"},
      {"a credit of 0", credit, 30, 0, "window"},
      {"a window in a plain request", request, 30, 1, "window"},
      {"a window in a cancel", cancel, 31, 0x80, "window"},
      {"a window in a stream message", message, 30, 1, "window"},
      {"a window in a half-close", half_close, 30, 1, "window"},
      {"a window in a response", response, 31, 1, "window"},
      {"bulk flag in a half-close", half_close, 1, 0x01, "flags"},
      {"bulk flag in a credit", credit, 1, 0x01, "flags"},
      {"service id in a stream message", message, 4, 1, "service_id"},
      {"timeout in a credit", credit, 16, 1, "timeout_us"},
      {"status code in a stream message", message, 28, 1, "status_code"},
      {"bulk flag without a size (stream message)", message, 1, 0x01, "bulk_size"},
      {"large-body flag without the bulk flag", request, 1, 0x08, "flags"},
      {"large-body flag in a cancel", cancel, 1, 0x08, "flags"},
      {"pull-response flag in a response", response, 1, 0x04, "flags"},
      {"pull-response flag in a cancel", cancel, 1, 0x04, "flags"},
      {"pull flag without the bulk flag", request, 1, 0x02, "flags"},
      {"pull flag in a cancel", cancel, 1, 0x02, "flags"},
      {"pull flag in a pulled", pulled, 1, 0x03, "flags"},
      {"bulk size in a pulled", pulled, 24, 1, "bulk_size"},
      {"timeout in a half-close", half_close, 16, 1, "timeout_us"},
      {"high flag bit", response, 1, 0x81, "flags"},
      {"status code past absl's range", error, 28, 17, "status_code"},
      {"status code high byte", error, 29, 1, "status_code"},
      {"OK in an error", error, 28, 0, "status_code"},
      {"status code in a request", request, 28, 2, "status_code"},
      {"status code in a response", response, 28, 2, "status_code"},
      {"status code in a cancel", cancel, 28, 1, "status_code"},
      {"service id in a response", response, 4, 1, "service_id"},
      {"service id in an error", error, 7, 1, "service_id"},
      {"service id in a cancel", cancel, 5, 1, "service_id"},
      {"method index in a response", response, 2, 1, "method_index"},
      {"method index in an error", error, 3, 1, "method_index"},
      {"method index in a cancel", cancel, 2, 1, "method_index"},
      {"timeout in a response", response, 16, 1, "timeout_us"},
      {"timeout in an error", error, 23, 1, "timeout_us"},
      {"timeout in a cancel", cancel, 20, 1, "timeout_us"},
      {"bulk flag without a size (request)", request, 1, 0x01, "bulk_size"},
      {"bulk flag without a size (response)", response, 1, 0x01, "bulk_size"},
      {"bulk size without the flag (request)", request, 24, 9, "bulk_size"},
      {"bulk size without the flag (response)", response, 27, 1, "bulk_size"},
      {"bulk flag in an error", error, 1, 0x01, "flags"},
      {"bulk flag in a cancel", cancel, 1, 0x01, "flags"},
      {"bulk size in an error", error, 24, 1, "bulk_size"},
      {"bulk size in a cancel", cancel, 25, 1, "bulk_size"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bytes = Message(c.base);
    REQUIRE(DecodeRpcHeader(bytes).ok());
    bytes[c.offset] = c.value;
    INFO(c.what);
    CHECK(Refused(bytes, c.field));
  }
  // Call id 0 in every kind (and nothing else wrong).
  for (RpcHeader h : {request, response, error, cancel}) {
    h.call_id = 0;
    CHECK(Refused(Message(h), "call_id"));
  }
  // Bodies the kind does not allow.
  CHECK(Refused(Message(cancel, 1), "body"));
  CHECK(Refused(Message(pulled, 1), "body"));
  CHECK(Refused(Message(half_close, 1), "body"));
  CHECK(Refused(Message(credit, 1), "body"));
  CHECK(DecodeRpcHeader(Message(message, 0)).ok());  // an empty message is a message
  CHECK(DecodeRpcHeader(Message(open, 0)).ok());     // a client-streaming open has no body
  // A pulled payload's body must hold its descriptor.
  RpcHeader pull = RpcHeader::Response(kId, 1 << 30);
  pull.flags |= zrpc::kRpcFlagPull;
  CHECK(Refused(Message(pull, zrpc::PullDescriptor::kSize - 1), "body"));
  CHECK(DecodeRpcHeader(Message(pull, zrpc::PullDescriptor::kSize)).ok());
  // A large body's message must hold its trailer.
  RpcHeader large = RpcHeader::Request(7, 1, kId, 0, 5000);
  large.flags |= zrpc::kRpcFlagLargeBody;
  CHECK(Refused(Message(large, zrpc::LargeBody::kSize - 1), "body"));
  CHECK(DecodeRpcHeader(Message(large, zrpc::LargeBody::kSize)).ok());
  CHECK(Refused(Message(error, kMaxErrorMessage + 1), "body"));
  CHECK(DecodeRpcHeader(Message(error, kMaxErrorMessage)).ok());
  CHECK(DecodeRpcHeader(Message(error, 0)).ok());
}

TEST_CASE("random bytes never crash: they are refused or re-encode identically", "[rpc_header]") {
  std::mt19937_64 rng(20261123);
  std::vector<RpcHeader> valid = OneOfEachKind();
  size_t accepted = 0;
  for (int i = 0; i < 10'000; ++i) {
    std::vector<uint8_t> bytes;
    if (i % 2 == 0) {
      // Pure noise, of any length up to a few headers.
      bytes.resize(rng() % 100);
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    } else {
      // A valid message with a few bytes changed: reaches the checks past the kind.
      const RpcHeader& h = valid[rng() % valid.size()];
      bytes = Message(h, HeaderOnly(h.kind) ? 0 : rng() % 64);
      for (int flips = 1 + rng() % 3; flips > 0; --flips) {
        bytes[rng() % RpcHeader::kSize] = static_cast<uint8_t>(rng() % 4 == 0 ? 0 : rng());
      }
    }
    // An exactly sized copy, so ASan sees any read past the end.
    auto* copy = new uint8_t[bytes.size() + 1];
    if (!bytes.empty()) std::memcpy(copy, bytes.data(), bytes.size());
    absl::StatusOr<RpcHeader> decoded =
        DecodeRpcHeader(absl::Span<const uint8_t>(copy, bytes.size()));
    delete[] copy;
    if (!decoded.ok()) {
      REQUIRE(decoded.status().code() == absl::StatusCode::kFailedPrecondition);
      REQUIRE(decoded.status().message().rfind("rpc header: ", 0) == 0);
      continue;
    }
    ++accepted;
    std::vector<uint8_t> again(RpcHeader::kSize);
    EncodeRpcHeader(*decoded, again.data());
    REQUIRE(std::equal(again.begin(), again.end(), bytes.begin()));
  }
  CHECK(accepted > 100);  // the mutations do reach valid headers, not only refusals
}

TEST_CASE("error bodies are bounded, truncated with a marker, and refused past the bound",
          "[rpc_header]") {
  auto body = [](absl::string_view message, size_t limit = kMaxErrorMessage) {
    std::string out(ErrorBodySize(message, limit), '\0');
    CHECK(EncodeErrorBody(message, reinterpret_cast<uint8_t*>(out.data()), limit) == out.size());
    return out;
  };
  CHECK(body("").empty());
  CHECK(body("no such user") == "no such user");
  const std::string fits(kMaxErrorMessage, 'x');
  CHECK(body(fits) == fits);
  const std::string longer(kMaxErrorMessage + 1, 'y');
  std::string cut = body(longer);
  CHECK(cut.size() == kMaxErrorMessage);
  CHECK(absl::string_view(cut).substr(cut.size() - kTruncatedMarker.size()) == kTruncatedMarker);
  CHECK(body(std::string(1 << 20, 'z')).size() == kMaxErrorMessage);
  // A larger limit counts as the bound; a smaller one is honoured, the marker included.
  CHECK(body(longer, 1 << 20).size() == kMaxErrorMessage);
  CHECK(body(longer, 100).size() == 100);
  CHECK(body(longer, 5) == std::string(kTruncatedMarker.substr(0, 5)));
  CHECK(body(longer, 0).empty());
  // A cut never splits a UTF-8 character: "é" is 2 bytes, so 1023 of them end on an odd byte.
  std::string accents;
  for (int i = 0; i < 600; ++i) accents += "\xc3\xa9";
  std::string cut_accents = body(accents);
  CHECK(cut_accents.size() <= kMaxErrorMessage);
  const size_t kept = cut_accents.size() - kTruncatedMarker.size();
  CHECK(kept % 2 == 0);
  CHECK(cut_accents.compare(0, kept, accents, 0, kept) == 0);

  // Decoding gives back the peer's status, and refuses a body past the bound.
  const RpcHeader error = RpcHeader::Error(kId, absl::StatusCode::kPermissionDenied);
  const std::string text = "not yours";
  absl::Status peer;
  REQUIRE(DecodeErrorBody(
              error,
              absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
              &peer)
              .ok());
  CHECK(peer == absl::PermissionDeniedError("not yours"));
  std::vector<uint8_t> too_long(kMaxErrorMessage + 1, 'a');
  absl::Status refused = DecodeErrorBody(error, too_long, &peer);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.message().find("body") != absl::string_view::npos);
  CHECK(!DecodeErrorBody(RpcHeader::Response(kId), {}, &peer).ok());
}

TEST_CASE("ServiceId is FNV-1a 32 of the full name", "[rpc_header]") {
  // Published FNV-1a 32-bit test vectors, checked at compile time.
  static_assert(zrpc::ServiceId("") == 0x811c9dc5u);
  static_assert(zrpc::ServiceId("a") == 0xe40c292cu);
  static_assert(zrpc::ServiceId("foobar") == 0xbf9cf968u);
  const std::vector<std::string> names = {"zrpc.test.Echo",
                                          "helloworld.Greeter",
                                          "a.b.C",
                                          "x",
                                          "package.with.many.parts.AndAVeryLongServiceName",
                                          "bytes\xff\x80 high"};
  for (const std::string& name : names) {
    INFO(name);
    CHECK(zrpc::ServiceId(name) == Fnv1a(name));
  }
  CHECK(zrpc::ServiceId("zrpc.test.Echo") != zrpc::ServiceId("zrpc.test.Echp"));
}

TEST_CASE("deadlines travel as remaining microseconds, rounded up, saturating at the edges",
          "[rpc_header]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const int64_t now = 1'800'000'000'000'000'000;   // ~57 years of nanoseconds
  CHECK(zrpc::TimeoutToWireNanos(now, now) == 1);  // just passed: not "no deadline"
  CHECK(zrpc::TimeoutToWireNanos(now - 5'000'000'000, now) == 1);
  CHECK(zrpc::TimeoutToWireNanos(kMin, now) == 1);
  CHECK(zrpc::TimeoutToWireNanos(now + 1, now) == 1);
  CHECK(zrpc::TimeoutToWireNanos(now + 999, now) == 1);
  CHECK(zrpc::TimeoutToWireNanos(now + 1000, now) == 1);
  CHECK(zrpc::TimeoutToWireNanos(now + 1001, now) == 2);  // rounded up
  CHECK(zrpc::TimeoutToWireNanos(now + 1500, now) == 2);
  CHECK(zrpc::TimeoutToWireNanos(now + 10'000'000'000, now) == 10'000'000);
  // The widest span there is, without overflow.
  CHECK(zrpc::TimeoutToWireNanos(kMax, kMin) == (~uint64_t{0}) / 1000 + 1);

  CHECK(zrpc::DeadlineNanosFromWire(0, now) == kMax);  // none
  CHECK(zrpc::DeadlineNanosFromWire(~uint64_t{0}, now) == kMax);
  CHECK(zrpc::DeadlineNanosFromWire(kMax / 1000, 0) == kMax / 1000 * 1000);
  CHECK(zrpc::DeadlineNanosFromWire(kMax / 1000 + 1, 0) == kMax);  // past the range: none
  CHECK(zrpc::DeadlineNanosFromWire(kMax / 1000, now) == kMax);    // saturates
  CHECK(zrpc::DeadlineNanosFromWire(kMax / 1000, kMin) == kMin + kMax / 1000 * 1000);
  CHECK(zrpc::DeadlineNanosFromWire(250'000, now) == now + 250'000'000);
  CHECK(zrpc::DeadlineNanosFromWire(1, kMax - 1000) == kMax);  // lands on INT64_MAX: none
  CHECK(zrpc::DeadlineNanosFromWire(1, kMax - 1001) == kMax - 1);
  // A deadline on whole microseconds survives the trip; any other is rounded up to the next.
  for (const int64_t delta :
       {int64_t{1}, int64_t{999}, int64_t{1000}, int64_t{1'234'567'891}, int64_t{1'234'567'000}}) {
    INFO(delta);
    const int64_t back =
        zrpc::DeadlineNanosFromWire(zrpc::TimeoutToWireNanos(now + delta, now), now);
    CHECK(back >= now + delta);
    CHECK(back < now + delta + 1000);
    CHECK(back % 1000 == now % 1000);
  }
}

TEST_CASE("a pull descriptor round-trips its flags and refuses undefined ones and other sizes",
          "[rpc_header]") {
  zrpc::PullDescriptor d;
  d.addr = 0x0123456789abcdefull;
  d.rkey = 0xfedcba98u;
  d.flags = zrpc::kPullWindow;
  uint8_t bytes[zrpc::PullDescriptor::kSize];
  zrpc::EncodePullDescriptor(d, bytes);
  CHECK(bytes[0] == 0xef);  // little-endian
  CHECK(bytes[8] == 0x98);
  CHECK(bytes[12] == 1);
  absl::StatusOr<zrpc::PullDescriptor> back = zrpc::DecodePullDescriptor(bytes);
  REQUIRE(back.ok());
  CHECK(back->addr == d.addr);
  CHECK(back->rkey == d.rkey);
  CHECK(back->flags == zrpc::kPullWindow);
  bytes[12] = 0;
  REQUIRE(zrpc::DecodePullDescriptor(bytes).ok());
  CHECK(zrpc::DecodePullDescriptor(bytes)->flags == 0);
  for (int bit = 1; bit < 32; ++bit) {  // each undefined bit, alone and beside kPullWindow
    INFO("bit " << bit);
    for (uint32_t base : {0u, zrpc::kPullWindow}) {
      const uint32_t flags = base | (uint32_t{1} << bit);
      for (int i = 0; i < 4; ++i) bytes[12 + i] = static_cast<uint8_t>(flags >> (8 * i));
      CHECK(zrpc::DecodePullDescriptor(bytes).status().code() ==
            absl::StatusCode::kFailedPrecondition);
    }
  }
  CHECK_FALSE(zrpc::DecodePullDescriptor(absl::MakeConstSpan(bytes, 15)).ok());
}

namespace {

// A request of `bulk_size` payload bytes with `flags`, whose body after the header is `body`.
std::vector<uint8_t> WithBody(uint8_t flags, uint32_t bulk_size, std::vector<uint8_t> body) {
  RpcHeader h = RpcHeader::Request(7, 1, kId, 0, bulk_size);
  h.flags |= flags;
  std::vector<uint8_t> bytes(RpcHeader::kSize);
  zrpc::EncodeRpcHeader(h, bytes.data());
  bytes.insert(bytes.end(), body.begin(), body.end());
  return bytes;
}

std::vector<uint8_t> Trailer(uint32_t body_size) {
  std::vector<uint8_t> out(zrpc::LargeBody::kSize);
  zrpc::EncodeLargeBody(body_size, out.data());
  return out;
}

std::vector<uint8_t> Descriptor(uint64_t addr, uint32_t rkey, uint32_t flags = 0) {
  std::vector<uint8_t> out(zrpc::PullDescriptor::kSize);
  zrpc::PullDescriptor d;
  d.addr = addr;
  d.rkey = rkey;
  d.flags = flags;
  zrpc::EncodePullDescriptor(d, out.data());
  return out;
}

std::vector<uint8_t> Concat(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

absl::StatusOr<zrpc::MessageLayout> Layout(const std::vector<uint8_t>& bytes) {
  absl::StatusOr<RpcHeader> h = DecodeRpcHeader(bytes);
  if (!h.ok()) return h.status();
  return zrpc::DecodeLayout(*h, bytes);
}

}  // namespace

TEST_CASE("a message's layout: inline body, large body, one or two ranges to pull",
          "[rpc_header]") {
  using zrpc::kRpcFlagBulk;
  using zrpc::kRpcFlagLargeBody;
  using zrpc::kRpcFlagPull;
  // Inline body with an arena payload: the whole body is the message's.
  auto plain = Layout(WithBody(kRpcFlagBulk, 100, std::vector<uint8_t>(40, 1)));
  REQUIRE(plain.ok());
  CHECK(plain->body.size() == 40);
  CHECK(plain->payload_body == 0);
  CHECK(plain->pull_count == 0);
  // Inline body, pulled payload: the descriptor ends the body.
  auto pulled = Layout(WithBody(kRpcFlagBulk | kRpcFlagPull, 1 << 20,
                                Concat({std::vector<uint8_t>(10, 2), Descriptor(0x1000, 9)})));
  REQUIRE(pulled.ok());
  CHECK(pulled->body.size() == 10);
  REQUIRE(pulled->pull_count == 1);
  CHECK(pulled->pulls[0].addr == 0x1000);
  CHECK(pulled->bulk_size(RpcHeader::Request(7, 1, kId, 0, 1 << 20)) == 1u << 20);
  // A large body written into the arena, with 100 bytes of bulk behind it.
  auto written = Layout(WithBody(kRpcFlagBulk | kRpcFlagLargeBody, 5100, Trailer(5000)));
  REQUIRE(written.ok());
  CHECK(written->body.empty());
  CHECK(written->payload_body == 5000);
  CHECK(written->bulk_size(RpcHeader::Request(7, 1, kId, 0, 5100)) == 100);
  // A large body alone, pulled: one range. With a bulk payload: two, body first.
  auto alone = Layout(WithBody(kRpcFlagBulk | kRpcFlagPull | kRpcFlagLargeBody, 5000,
                               Concat({Trailer(5000), Descriptor(0x2000, 3)})));
  REQUIRE(alone.ok());
  CHECK(alone->pull_count == 1);
  auto both =
      Layout(WithBody(kRpcFlagBulk | kRpcFlagPull | kRpcFlagLargeBody, 5100,
                      Concat({Trailer(5000), Descriptor(0x2000, 3), Descriptor(0x9000, 4)})));
  REQUIRE(both.ok());
  REQUIRE(both->pull_count == 2);
  CHECK(both->pulls[0].addr == 0x2000);
  CHECK(both->pulls[1].rkey == 4);

  auto refused = [](const std::vector<uint8_t>& bytes) {
    absl::StatusOr<zrpc::MessageLayout> layout = Layout(bytes);
    return !layout.ok() && layout.status().code() == absl::StatusCode::kFailedPrecondition;
  };
  const uint8_t large = kRpcFlagBulk | kRpcFlagLargeBody;
  const uint8_t large_pulled = large | kRpcFlagPull;
  CHECK(refused(WithBody(large, 5000, Trailer(0))));                    // no body
  CHECK(refused(WithBody(large, 5000, Trailer(5001))));                 // past the payload
  CHECK(refused(WithBody(large, 5000, Concat({Trailer(5000), {1}}))));  // inline bytes too
  std::vector<uint8_t> reserved = Trailer(10);
  reserved[7] = 1;
  CHECK(refused(WithBody(large, 5000, reserved)));
  // The number of descriptors follows the sizes: two needed, one given, and the reverse.
  CHECK(refused(WithBody(large_pulled, 5100, Concat({Trailer(5000), Descriptor(1, 1)}))));
  CHECK(refused(
      WithBody(large_pulled, 5000, Concat({Trailer(5000), Descriptor(1, 1), Descriptor(2, 2)}))));
  std::vector<uint8_t> bad_descriptor = Descriptor(1, 1);
  bad_descriptor[12] = 2;  // no flag but kPullWindow is defined
  CHECK(refused(WithBody(large_pulled, 5000, Concat({Trailer(5000), bad_descriptor}))));

  // Windows: the pulled that ends the exposure invalidates the first descriptor's key.
  CHECK(pulled->invalidate_rkey == 0);  // a registration's key: nothing to invalidate
  CHECK(both->invalidate_rkey == 0);
  const uint32_t window = zrpc::kPullWindow;
  auto one_window =
      Layout(WithBody(kRpcFlagBulk | kRpcFlagPull, 1 << 20,
                      Concat({std::vector<uint8_t>(10, 2), Descriptor(0x1000, 0x1234, window)})));
  REQUIRE(one_window.ok());
  CHECK(one_window->pulls[0].flags == window);
  CHECK(one_window->invalidate_rkey == 0x1234);
  auto two_windows = Layout(WithBody(large_pulled, 5100,
                                     Concat({Trailer(5000), Descriptor(0x2000, 0x5601, window),
                                             Descriptor(0x9000, 0x7702, window)})));
  REQUIRE(two_windows.ok());
  CHECK(two_windows->invalidate_rkey == 0x5601);
  // The two descriptors of one message carry the same flags.
  CHECK(refused(
      WithBody(large_pulled, 5100,
               Concat({Trailer(5000), Descriptor(0x2000, 3, window), Descriptor(0x9000, 4, 0)}))));
  CHECK(refused(
      WithBody(large_pulled, 5100,
               Concat({Trailer(5000), Descriptor(0x2000, 3, 0), Descriptor(0x9000, 4, window)}))));
}
