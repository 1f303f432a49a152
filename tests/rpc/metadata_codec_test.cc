// Metadata (rpc/metadata.h) and its block on the wire (rpc/connection/rpc_header.h, WIRE.md
// "Metadata"): the rules Add enforces at and one past each limit, the block's round trip with an
// error's status payloads, where the block sits beside a large body and pull descriptors, and
// every malformed block a hostile peer could send refused by name.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/metadata.h"

namespace {

using zrpc::DecodeMetadataBlock;
using zrpc::EncodeMetadataBlock;
using zrpc::Metadata;
using zrpc::MetadataBlock;
using zrpc::MetadataBlockSize;
using zrpc::RpcHeader;

constexpr uint64_t kId = 77;

std::vector<uint8_t> Block(const Metadata* metadata, const absl::Status* status = nullptr) {
  std::vector<uint8_t> out(MetadataBlockSize(metadata, status));
  if (!out.empty()) EncodeMetadataBlock(metadata, status, out.data());
  return out;
}

// A message of `header` whose body is `body`, decoded back into its layout. The layout's spans
// point into `bytes`, which moves with it (a vector's move keeps its buffer).
struct Decoded {
  std::vector<uint8_t> bytes;
  absl::StatusOr<zrpc::MessageLayout> layout;
  bool ok() const { return layout.ok(); }
  const zrpc::MessageLayout* operator->() const { return &*layout; }
};
Decoded Layout(const RpcHeader& header, const std::vector<uint8_t>& body) {
  Decoded decoded;
  decoded.bytes.resize(RpcHeader::kSize);
  zrpc::EncodeRpcHeader(header, decoded.bytes.data());
  decoded.bytes.insert(decoded.bytes.end(), body.begin(), body.end());
  absl::StatusOr<RpcHeader> h = zrpc::DecodeRpcHeader(decoded.bytes);
  decoded.layout = h.ok() ? zrpc::DecodeLayout(*h, decoded.bytes)
                          : absl::StatusOr<zrpc::MessageLayout>(h.status());
  return decoded;
}

RpcHeader WithMetadata(RpcHeader header) {
  header.flags |= zrpc::kRpcFlagMetadata;
  return header;
}

std::vector<uint8_t> Concat(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// An entry written by hand: type, key size, value size, key, value.
std::vector<uint8_t> Entry(uint8_t type, const std::string& key, const std::string& value) {
  std::vector<uint8_t> out{type, static_cast<uint8_t>(key.size()),
                           static_cast<uint8_t>(value.size() & 0xff),
                           static_cast<uint8_t>(value.size() >> 8)};
  out.insert(out.end(), key.begin(), key.end());
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

// A block around `entries`, its size field saying `claimed` (default: their size).
std::vector<uint8_t> RawBlock(const std::vector<uint8_t>& entries, int64_t claimed = -1) {
  const uint32_t size =
      claimed < 0 ? static_cast<uint32_t>(entries.size()) : static_cast<uint32_t>(claimed);
  std::vector<uint8_t> out{static_cast<uint8_t>(size), static_cast<uint8_t>(size >> 8),
                           static_cast<uint8_t>(size >> 16), static_cast<uint8_t>(size >> 24)};
  out.insert(out.end(), entries.begin(), entries.end());
  return out;
}

bool RefusedNaming(const absl::Status& status, const std::string& what) {
  INFO(status);
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         status.message().find(what) != absl::string_view::npos;
}

}  // namespace

TEST_CASE("Add keeps order and repeats, and refuses what breaks a rule, leaving the rest",
          "[metadata]") {
  Metadata m;
  REQUIRE(m.Add("tenant", "blue").ok());
  REQUIRE(m.Add("x-trace.id_2", "a b c ~").ok());
  REQUIRE(m.Add("tenant", "green").ok());
  REQUIRE(m.Add("blob-bin", std::string("\0\xff\n", 3)).ok());
  CHECK(m.size() == 4);
  CHECK(*m.Find("tenant") == "blue");
  CHECK(m.FindAll("tenant") == std::vector<absl::string_view>{"blue", "green"});
  CHECK(m.Find("absent") == nullptr);
  const size_t before = m.encoded_size();
  CHECK(before == 4 * Metadata::kEntryOverhead + 6 + 4 + 12 + 7 + 6 + 5 + 8 + 3);

  CHECK(m.Add("", "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.Add("Upper", "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.Add("sp ace", "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.Add(std::string(256, 'k'), "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.Add(std::string(255, 'k'), "v").ok());  // at the limit
  CHECK(m.Add("text", "line\nbreak").code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.Add("text", std::string("\x7f")).code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.Add("zrpc-anything", "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(m.size() == 5);

  // kMaxSize exactly, then one byte past it.
  Metadata full;
  const size_t value = Metadata::kMaxSize - Metadata::kEntryOverhead - 1;
  REQUIRE(full.Add("k", std::string(value, 'v')).ok());
  CHECK(full.encoded_size() == Metadata::kMaxSize);
  CHECK(full.Add("k", "").code() == absl::StatusCode::kResourceExhausted);
  Metadata over;
  CHECK(over.Add("k", std::string(value + 1, 'v')).code() == absl::StatusCode::kResourceExhausted);
  CHECK(over.empty());
  CHECK(over.encoded_size() == 0);
}

TEST_CASE("a block round-trips metadata, and an error's status payloads beside it", "[metadata]") {
  Metadata m;
  REQUIRE(m.Add("a", "1").ok());
  REQUIRE(m.Add("b-bin", std::string("\0\1", 2)).ok());
  REQUIRE(m.Add("a", "").ok());
  absl::Status error = absl::NotFoundError("no such key");
  error.SetPayload("type.googleapis.com/google.rpc.ErrorInfo", absl::Cord("structured"));
  error.SetPayload("example.com/retry", absl::Cord(std::string(3, '\0')));

  std::vector<uint8_t> block = Block(&m, &error);
  REQUIRE(block.size() == MetadataBlock::kPrefix + m.encoded_size() + 2 * Metadata::kEntryOverhead +
                              40 + 10 + 17 + 3);
  Metadata decoded;
  absl::Status peer = absl::NotFoundError("no such key");
  REQUIRE(DecodeMetadataBlock(absl::MakeConstSpan(block).subspan(MetadataBlock::kPrefix), &decoded,
                              &peer)
              .ok());
  CHECK(decoded == m);
  CHECK(peer == error);  // payloads compared too

  // A payload in several pieces (a Cord of chunks) is written piece by piece.
  absl::Cord pieces;
  for (char c : {'x', 'y', 'z'}) pieces.Append(std::string(700, c));
  absl::Status chunked = absl::AbortedError("pieces");
  chunked.SetPayload("t/pieces", pieces);
  std::vector<uint8_t> chunked_block = Block(nullptr, &chunked);
  Metadata none_back;
  absl::Status chunked_back = absl::AbortedError("pieces");
  REQUIRE(DecodeMetadataBlock(absl::MakeConstSpan(chunked_block).subspan(MetadataBlock::kPrefix),
                              &none_back, &chunked_back)
              .ok());
  CHECK(chunked_back == chunked);

  // Nothing to send: no block at all.
  Metadata none;
  const absl::Status plain = absl::InternalError("x");
  CHECK(MetadataBlockSize(&none, &plain) == 0);
  CHECK(MetadataBlockSize(nullptr, nullptr) == 0);
  const absl::Status ok = absl::OkStatus();
  CHECK(MetadataBlockSize(&m, &ok) == MetadataBlock::kPrefix + m.encoded_size());

  // Payloads that do not fit beside the metadata are dropped, and said to be.
  Metadata full;
  REQUIRE(full.Add("k", std::string(Metadata::kMaxSize - 20, 'v')).ok());
  absl::Status big = absl::AbortedError("x");
  big.SetPayload("t/small", absl::Cord("1"));
  big.SetPayload("t/large", absl::Cord(std::string(100, 'p')));
  bool dropped = false;
  const size_t size = MetadataBlockSize(&full, &big, &dropped);
  CHECK(dropped);
  CHECK(size <= MetadataBlock::kPrefix + Metadata::kMaxSize);
  std::vector<uint8_t> cut(size);
  EncodeMetadataBlock(&full, &big, cut.data());
  Metadata back;
  absl::Status back_status = absl::AbortedError("x");
  REQUIRE(DecodeMetadataBlock(absl::MakeConstSpan(cut).subspan(MetadataBlock::kPrefix), &back,
                              &back_status)
              .ok());
  CHECK(back == full);
  CHECK(back_status.GetPayload("t/small").has_value());
  CHECK_FALSE(back_status.GetPayload("t/large").has_value());
}

TEST_CASE("the block comes first in the body: an inline body, a large body, descriptors after it",
          "[metadata]") {
  Metadata m;
  REQUIRE(m.Add("k", "v").ok());
  const std::vector<uint8_t> block = Block(&m);
  const std::vector<uint8_t> message(10, 0x42);
  auto inline_body =
      Layout(WithMetadata(RpcHeader::Request(7, 1, kId, 0)), Concat({block, message}));
  REQUIRE(inline_body.ok());
  CHECK(inline_body->metadata.size() == m.encoded_size());
  CHECK(inline_body->body.size() == message.size());
  CHECK(inline_body->body[0] == 0x42);

  // A large body pulled with a bulk payload: block, trailer, two descriptors.
  std::vector<uint8_t> trailer(zrpc::LargeBody::kSize);
  zrpc::EncodeLargeBody(5000, trailer.data());
  std::vector<uint8_t> descriptors(2 * zrpc::PullDescriptor::kSize, 0);
  RpcHeader large = WithMetadata(RpcHeader::Request(7, 1, kId, 0, 5100));
  large.flags |= zrpc::kRpcFlagLargeBody | zrpc::kRpcFlagPull;
  auto pulled = Layout(large, Concat({block, trailer, descriptors}));
  REQUIRE(pulled.ok());
  CHECK(pulled->metadata.size() == m.encoded_size());
  CHECK(pulled->payload_body == 5000);
  CHECK(pulled->pull_count == 2);
  // A block that leaves fewer bytes than the trailer's 8 is refused before any is read (the
  // header's own check counted the block's bytes as the trailer's).
  RpcHeader written_large = WithMetadata(RpcHeader::Request(7, 1, kId, 0, 5000));
  written_large.flags |= zrpc::kRpcFlagLargeBody;
  for (size_t cut = 0; cut < zrpc::LargeBody::kSize; ++cut) {
    std::vector<uint8_t> short_trailer(trailer.begin(), trailer.begin() + cut);
    auto refused = Layout(written_large, Concat({block, short_trailer}));
    REQUIRE_FALSE(refused.ok());
    CHECK(RefusedNaming(refused.layout.status(), "too few for the 8-byte large-body trailer"));
  }
  CHECK(Layout(written_large, Concat({block, trailer})).ok());
  // A stray byte between the block and the trailer breaks "exactly the trailer".
  CHECK_FALSE(Layout(large, Concat({block, {0}, trailer, descriptors})).ok());

  // Answers: a response, and an error whose message follows the block.
  auto response = Layout(WithMetadata(RpcHeader::Response(kId)), block);
  REQUIRE(response.ok());
  CHECK(response->body.empty());
  const std::string text = "not here";
  auto error = Layout(WithMetadata(RpcHeader::Error(kId, absl::StatusCode::kNotFound)),
                      Concat({block, std::vector<uint8_t>(text.begin(), text.end())}));
  REQUIRE(error.ok());
  absl::Status peer;
  REQUIRE(
      zrpc::DecodeErrorBody(RpcHeader::Error(kId, absl::StatusCode::kNotFound), error->body, &peer)
          .ok());
  CHECK(peer.message() == text);
  // An error may carry a block and the longest message beside it; one byte more is refused.
  const std::vector<uint8_t> longest(zrpc::kMaxErrorMessage, 'e');
  Metadata biggest;
  REQUIRE(
      biggest.Add("k", std::string(Metadata::kMaxSize - Metadata::kEntryOverhead - 1, 'v')).ok());
  const std::vector<uint8_t> big_block = Block(&biggest);
  const RpcHeader big_error = WithMetadata(RpcHeader::Error(kId, absl::StatusCode::kAborted));
  CHECK(Layout(big_error, Concat({big_block, longest})).ok());
  CHECK_FALSE(Layout(big_error, Concat({big_block, longest, {'e'}})).ok());
}

TEST_CASE("a malformed block is refused, naming what is wrong", "[metadata]") {
  const RpcHeader request = WithMetadata(RpcHeader::Request(7, 1, kId, 0));
  auto refused = [&](const std::vector<uint8_t>& body, const std::string& what) {
    auto layout = Layout(request, body);
    if (!layout.ok()) return RefusedNaming(layout.layout.status(), what);
    Metadata m;
    return RefusedNaming(DecodeMetadataBlock(layout->metadata, &m, nullptr), what);
  };
  const std::vector<uint8_t> good = Entry(0, "k", "v");
  CHECK(refused({1, 0}, "too few for its size"));
  CHECK(refused(RawBlock({}, 0), "claims 0 bytes"));
  CHECK(refused(RawBlock(good, good.size() + 1), "claims"));
  CHECK(refused(RawBlock(std::vector<uint8_t>(Metadata::kMaxSize + 1, 0)), "claims 3073 bytes"));
  CHECK(refused(RawBlock({0, 1, 0}), "entry 0 is cut short"));
  std::vector<uint8_t> long_value = Entry(0, "k", "vv");
  long_value[2] = 9;  // claims 9 bytes of value, has 2
  CHECK(refused(RawBlock(Concat({good, long_value})), "entry 1 claims"));
  CHECK(refused(RawBlock(Entry(0, "", "v")), "1 to 255"));
  CHECK(refused(RawBlock(Entry(0, "K", "v")), "only lowercase"));
  CHECK(refused(RawBlock(Entry(0, "k", "\n")), "printable ASCII"));
  CHECK(refused(RawBlock(Entry(2, "k", "v")), "type 2"));
  CHECK(refused(RawBlock(Entry(1, "t/x", "v")), "status payload outside an error"));
  // The runtime's own keys decode (the rules Add keeps for applications are not the wire's).
  auto zrpc_key = Layout(request, RawBlock(Entry(0, "zrpc-x", "v")));
  REQUIRE(zrpc_key.ok());
  Metadata m;
  CHECK(DecodeMetadataBlock(zrpc_key->metadata, &m, nullptr).ok());

  // The flag where no metadata may go.
  auto header_refused = [](RpcHeader header) {
    header.flags |= zrpc::kRpcFlagMetadata;
    std::vector<uint8_t> bytes(RpcHeader::kSize + 8, 0);
    zrpc::EncodeRpcHeader(header, bytes.data());
    absl::StatusOr<RpcHeader> decoded = zrpc::DecodeRpcHeader(bytes);
    return !decoded.ok() && RefusedNaming(decoded.status(), "flags");
  };
  CHECK(header_refused(RpcHeader::StreamMessage(kId)));
  CHECK(header_refused(RpcHeader::Cancel(kId)));
  CHECK(header_refused(RpcHeader::Pulled(kId, 0x1000)));
  CHECK(header_refused(RpcHeader::HalfClose(kId)));
  CHECK(header_refused(RpcHeader::StreamCredit(kId, 1)));
}
