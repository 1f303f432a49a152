// The transport's wire format, on the host: round trips, exact bytes, and every malformed input
// the decoder must refuse without reading past what it was given.
#include "transport/wire.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "transport/arena.h"

namespace {

using zrpc::transport::ArenaMessage;
using zrpc::transport::ArenaOp;
using zrpc::transport::DecodeArenaMessage;
using zrpc::transport::DecodeFrameHeader;
using zrpc::transport::DecodeHello;
using zrpc::transport::EncodeArenaMessage;
using zrpc::transport::EncodeFrameHeader;
using zrpc::transport::EncodeHello;
using zrpc::transport::FrameHeader;
using zrpc::transport::FrameKind;
using zrpc::transport::Hello;
using zrpc::transport::kArenaAlign;
using zrpc::transport::kHelloArenaOnDemand;
using zrpc::transport::kMaxArenaSize;

Hello Sample() {
  Hello h;
  h.recv_credits = 64;
  h.max_recv_credits = 256;
  h.recv_size = 4096;
  h.arena_addr = 0x00007f1234567000;
  h.arena_rkey = 0xdeadbeef;
  h.arena_size = 1 << 20;
  return h;
}

std::vector<uint8_t> Encoded(const Hello& h) {
  std::vector<uint8_t> bytes(Hello::kSize);
  EncodeHello(h, bytes.data());
  return bytes;
}

bool Refused(const std::vector<uint8_t>& bytes, const char* needle) {
  auto decoded = DecodeHello(bytes);
  if (decoded.ok()) return false;
  INFO(decoded.status());
  return decoded.status().code() == absl::StatusCode::kFailedPrecondition &&
         decoded.status().message().find(needle) != absl::string_view::npos;
}

}  // namespace

TEST_CASE("a Hello survives encode and decode, and its bytes are little-endian", "[wire]") {
  std::vector<uint8_t> bytes = Encoded(Sample());
  REQUIRE(bytes.size() <= zrpc::transport::kMaxConnectPrivateData);
  const uint8_t magic[] = {0x43, 0x50, 0x52, 0x5a};
  CHECK(std::memcmp(bytes.data(), magic, 4) == 0);
  CHECK(bytes[4] == 11);  // version (kWireVersion)
  CHECK(bytes[32] == 0);  // max_recv_credits 256, least significant byte first
  CHECK(bytes[33] == 1);
  CHECK(bytes[5] == 0);
  CHECK(bytes[24] == 0xef);  // rkey, least significant byte first
  auto decoded = DecodeHello(bytes);
  REQUIRE(decoded.ok());
  CHECK(*decoded == Sample());
  // Later versions may append fields: extra bytes are ignored.
  bytes.resize(56, 0xff);
  CHECK(DecodeHello(bytes).ok());
}

TEST_CASE("a malformed Hello is refused with a message naming the problem", "[wire]") {
  std::vector<uint8_t> good = Encoded(Sample());

  SECTION("another magic") {
    auto bad = good;
    bad[0] ^= 1;
    CHECK(Refused(bad, "not zrpc"));
  }
  SECTION("another version") {
    Hello h = Sample();
    h.version = 1;  // before pulled payloads (rpc/WIRE.md)
    CHECK(Refused(Encoded(h), "version 1"));
  }
  SECTION("unknown flags") {
    Hello h = Sample();
    h.flags = 8;
    CHECK(Refused(Encoded(h), "flags"));
  }
  SECTION("too few credits to be deadlock-free") {
    Hello h = Sample();
    h.recv_credits = 2;
    CHECK(Refused(Encoded(h), "credits"));
    h.recv_credits = 3;
    CHECK(DecodeHello(Encoded(h)).ok());
  }
  SECTION("more credits than a frame can return") {
    Hello h = Sample();
    h.recv_credits = 65536;
    h.max_recv_credits = 65536;
    CHECK(Refused(Encoded(h), "credits"));
    h.recv_credits = 65535;
    CHECK(Refused(Encoded(h), "may reach 65536"));
    h.max_recv_credits = 65535;
    CHECK(DecodeHello(Encoded(h)).ok());
  }
  SECTION("a window that may reach less than it starts with") {
    Hello h = Sample();
    h.max_recv_credits = h.recv_credits - 1;
    CHECK(Refused(Encoded(h), "may reach 63"));
    h.max_recv_credits = h.recv_credits;
    CHECK(DecodeHello(Encoded(h)).ok());
  }
  SECTION("receives too small for a frame header") {
    Hello h = Sample();
    h.recv_size = 7;
    CHECK(Refused(Encoded(h), "receive size"));
  }
  SECTION("an arena size the ring cannot use") {
    Hello h = Sample();
    h.arena_size = 100;
    CHECK(Refused(Encoded(h), "multiple of 64"));
    h.arena_size = (1u << 30) + 64;
    CHECK(Refused(Encoded(h), "multiple of 64"));
  }
  SECTION("an arena that wraps the address space") {
    Hello h = Sample();
    h.arena_addr = ~uint64_t{0} - 10000;
    CHECK(Refused(Encoded(h), "wraps"));
  }
  SECTION("every truncation, including empty") {
    for (size_t n = 0; n < Hello::kSize; ++n) {
      std::vector<uint8_t> cut(good.begin(), good.begin() + n);
      INFO("length " << n);
      CHECK(!DecodeHello(cut).ok());
    }
  }
  SECTION("random garbage never decodes and never crashes") {
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 2000; ++round) {
      std::vector<uint8_t> junk(round % 60);
      for (auto& b : junk) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b = static_cast<uint8_t>(x);
      }
      CHECK(!DecodeHello(junk).ok());
    }
  }
}

TEST_CASE("each field a peer announces is taken at its minimum and maximum, refused one past",
          "[wire]") {
  auto accepted = [](const Hello& h) {
    auto decoded = DecodeHello(Encoded(h));
    INFO(decoded.status());
    return decoded.ok() && *decoded == h;
  };
  SECTION("recv_credits: [3, 65535]; max_recv_credits: [recv_credits, 65535]") {
    Hello h = Sample();
    h.recv_credits = 3;
    CHECK(accepted(h));
    h.recv_credits = 2;
    CHECK(Refused(Encoded(h), "credits"));
    h.recv_credits = 65535;
    CHECK(Refused(Encoded(h), "may reach"));  // beyond max_recv_credits
    h.max_recv_credits = 65535;
    CHECK(accepted(h));
    h.recv_credits = 65536;
    CHECK(Refused(Encoded(h), "credits"));
    h.recv_credits = ~uint32_t{0};
    CHECK(Refused(Encoded(h), "credits"));
  }
  SECTION("recv_size: a frame header at least, any size above (the smaller side governs)") {
    Hello h = Sample();
    h.recv_size = 8;
    CHECK(accepted(h));
    h.recv_size = 7;
    CHECK(Refused(Encoded(h), "receive size"));
    h.recv_size = 0;
    CHECK(Refused(Encoded(h), "receive size"));
    h.recv_size = ~uint32_t{0};
    CHECK(accepted(h));
  }
  SECTION("recv_size against what the layer above needs (CheckPeerReceives)") {
    using zrpc::transport::CheckPeerReceives;
    Hello h = Sample();
    h.recv_size = 8 + 288;
    CHECK(CheckPeerReceives(h, 288).ok());
    h.recv_size = 8 + 287;
    absl::Status refused = CheckPeerReceives(h, 288);
    CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(refused.message().find("295 bytes cannot carry the 288-byte messages") !=
          absl::string_view::npos);
    h.recv_size = ~uint32_t{0};
    CHECK(CheckPeerReceives(h, ~uint32_t{0} - 8).ok());
    CHECK_FALSE(CheckPeerReceives(h, ~uint32_t{0}).ok());  // no wrap-around in the sum
    h.recv_size = 8;
    CHECK(CheckPeerReceives(h, 0).ok());
  }
  SECTION("arena_size: 0 (no bulk) to 1 GiB in steps of 64") {
    Hello h = Sample();
    h.arena_size = 0;
    CHECK(accepted(h));
    h.arena_size = 64;
    CHECK(accepted(h));
    h.arena_size = 63;
    CHECK(Refused(Encoded(h), "multiple of 64"));
    h.arena_size = 1u << 30;
    CHECK(accepted(h));
    h.arena_size = (1u << 30) + 64;
    CHECK(Refused(Encoded(h), "multiple of 64"));
    h.arena_size = ~uint32_t{0} & ~uint32_t{63};
    CHECK(Refused(Encoded(h), "multiple of 64"));
  }
  SECTION("arena_addr: up to the last address the arena fits below") {
    Hello h = Sample();
    h.arena_size = 1 << 20;
    h.arena_addr = ~uint64_t{0} - h.arena_size;
    CHECK(accepted(h));
    h.arena_addr += 1;
    CHECK(Refused(Encoded(h), "wraps"));
    h.arena_addr = 0;
    CHECK(accepted(h));
  }
}

TEST_CASE("frame headers round-trip and malformed ones are refused", "[wire]") {
  uint8_t buf[16] = {};
  FrameHeader h;
  h.arena_released = 0xfffffff0;
  h.credits = 513;
  h.kind = FrameKind::kData;
  EncodeFrameHeader(h, buf);
  auto decoded = DecodeFrameHeader(absl::MakeConstSpan(buf, 12));
  REQUIRE(decoded.ok());
  CHECK(decoded->arena_released == 0xfffffff0);
  CHECK(decoded->credits == 513);
  CHECK(decoded->kind == FrameKind::kData);

  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, 7)).ok());
  CHECK(!DecodeFrameHeader({}).ok());
  buf[6] = 8;  // one past kAuthOk
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, 8)).ok());
  // The authentication frames carry their payloads exactly (auth.h).
  uint8_t auth[8 + 45] = {};
  auth[6] = static_cast<uint8_t>(FrameKind::kAuth);
  CHECK(DecodeFrameHeader(absl::MakeConstSpan(auth, 8 + 44)).ok());
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(auth, 8 + 43)).ok());
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(auth, 8 + 45)).ok());
  auth[6] = static_cast<uint8_t>(FrameKind::kAuthOk);
  CHECK(DecodeFrameHeader(absl::MakeConstSpan(auth, 8 + 28)).ok());
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(auth, 8 + 27)).ok());
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(auth, 8 + 29)).ok());
  buf[6] = 0;
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, 8)).ok());
  buf[6] = static_cast<uint8_t>(FrameKind::kCredit);
  buf[7] = 1;
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, 8)).ok());
  buf[7] = 0;
  CHECK(DecodeFrameHeader(absl::MakeConstSpan(buf, 8)).ok());
  // A credit update carries nothing else.
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, 9)).ok());
}

TEST_CASE("arena frames carry exactly one arena message, and bad ones are refused", "[wire]") {
  uint8_t buf[FrameHeader::kSize + ArenaMessage::kSize + 1] = {};
  FrameHeader h;
  h.kind = FrameKind::kArena;
  EncodeFrameHeader(h, buf);
  CHECK(DecodeFrameHeader(absl::MakeConstSpan(buf, FrameHeader::kSize + ArenaMessage::kSize)).ok());
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, FrameHeader::kSize)).ok());
  CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, sizeof(buf))).ok());

  ArenaMessage lend;
  lend.op = ArenaOp::kLend;
  lend.loan = 7;
  lend.addr = 0x7f0012345000;
  lend.rkey = 0x123456ab;
  lend.size = 256 * 1024;
  uint8_t m[ArenaMessage::kSize];
  EncodeArenaMessage(lend, m);
  CHECK(m[0] == 2);
  CHECK(m[4] == 7);
  CHECK(m[16] == 0xab);
  auto decoded = DecodeArenaMessage(m);
  REQUIRE(decoded.ok());
  CHECK(*decoded == lend);

  auto refused = [](ArenaMessage message, absl::string_view needle) {
    uint8_t bytes[ArenaMessage::kSize];
    EncodeArenaMessage(message, bytes);
    auto result = DecodeArenaMessage(bytes);
    return !result.ok() && result.status().message().find(needle) != absl::string_view::npos;
  };
  ArenaMessage ask;
  CHECK(DecodeArenaMessage([&] {
          std::vector<uint8_t> b(ArenaMessage::kSize);
          EncodeArenaMessage(ask, b.data());
          return b;
        }())
            .ok());
  ask.loan = 3;
  CHECK(refused(ask, "an ask names a loan"));
  ArenaMessage recall;
  recall.op = ArenaOp::kRecall;
  CHECK(refused(recall, "loan 0"));
  recall.loan = 2;
  recall.rkey = 1;
  CHECK(refused(recall, "address, key or size set"));
  ArenaMessage bad = lend;
  bad.size = 0;
  CHECK(refused(bad, "a loan of 0 bytes"));
  bad.size = 100;  // not a multiple of kArenaAlign
  CHECK(refused(bad, "a loan of 100 bytes"));
  bad.size = kMaxArenaSize + kArenaAlign;
  CHECK(refused(bad, "a loan of"));
  bad = lend;
  bad.addr = ~uint64_t{0} - 64;
  CHECK(refused(bad, "wraps"));
  uint8_t raw[ArenaMessage::kSize] = {};
  raw[0] = 5;
  CHECK(!DecodeArenaMessage(raw).ok());
  raw[0] = 0;
  CHECK(!DecodeArenaMessage(raw).ok());
  raw[0] = 1;
  raw[2] = 1;
  CHECK(!DecodeArenaMessage(raw).ok());
  CHECK(!DecodeArenaMessage(absl::MakeConstSpan(raw, 23)).ok());
}

TEST_CASE("a Hello may lend its arena on demand: a size, no address or key", "[wire]") {
  Hello h = Sample();
  h.flags = kHelloArenaOnDemand;
  h.arena_addr = 0;
  h.arena_rkey = 0;
  auto decoded = DecodeHello(Encoded(h));
  REQUIRE(decoded.ok());
  CHECK(*decoded == h);
  Hello with_key = h;
  with_key.arena_rkey = 5;
  CHECK(Refused(Encoded(with_key), "on demand"));
  Hello no_size = h;
  no_size.arena_size = 0;
  CHECK(Refused(Encoded(no_size), "on demand"));
  Hello other_flag = h;
  other_flag.flags = 8;
  CHECK(Refused(Encoded(other_flag), "unknown flags"));
}

TEST_CASE("a Hello that parks may offer no credit; one that does not may not", "[wire]") {
  Hello h = Sample();
  h.flags = zrpc::transport::kHelloParks;
  h.recv_credits = 0;
  auto decoded = DecodeHello(Encoded(h));
  REQUIRE(decoded.ok());
  CHECK(*decoded == h);
  Hello open = h;
  open.recv_credits = 3;
  CHECK(DecodeHello(Encoded(open)).ok());
  // Below the floor the credit scheme needs, parked or not, is refused.
  for (uint32_t credits : {1u, 2u}) {
    Hello few = h;
    few.recv_credits = credits;
    CHECK(Refused(Encoded(few), "receive credits"));
  }
  Hello no_flag = h;
  no_flag.flags = 0;
  CHECK(Refused(Encoded(no_flag), "receive credits"));
  // Parked, its window must still be able to reach the floor.
  Hello small = h;
  small.max_recv_credits = 2;
  CHECK(Refused(Encoded(small), "may reach"));
}

TEST_CASE("a Hello that authenticates gives no arena key, and may offer one credit", "[wire]") {
  using zrpc::transport::kHelloAuth;
  Hello h = Sample();
  h.flags = kHelloAuth;
  h.arena_addr = 0;
  h.arena_rkey = 0;
  auto decoded = DecodeHello(Encoded(h));
  REQUIRE(decoded.ok());
  CHECK(*decoded == h);
  // The accepting side's provisional window: one credit, for the client's kAuth frame.
  Hello provisional = h;
  provisional.recv_credits = 1;
  CHECK(DecodeHello(Encoded(provisional)).ok());
  provisional.flags |= zrpc::transport::kHelloParks;
  CHECK(DecodeHello(Encoded(provisional)).ok());
  // Not without the flag, and never two (or none: that is a parked start, with kHelloParks).
  Hello one = h;
  one.flags = 0;
  one.recv_credits = 1;
  CHECK(Refused(Encoded(one), "receive credits"));
  Hello two = h;
  two.recv_credits = 2;
  CHECK(Refused(Encoded(two), "receive credits"));
  Hello none = h;
  none.recv_credits = 0;
  CHECK(Refused(Encoded(none), "receive credits"));
  // The arena's address and key come in the first frame, once the peer is verified.
  Hello with_key = h;
  with_key.arena_rkey = 7;
  CHECK(Refused(Encoded(with_key), "before its tag"));
  Hello with_addr = h;
  with_addr.arena_addr = 4096;
  CHECK(Refused(Encoded(with_addr), "before its tag"));
}

TEST_CASE("park doors round-trip, and bad ones are refused", "[wire]") {
  using zrpc::transport::DecodeParkDoor;
  using zrpc::transport::EncodeParkDoor;
  using zrpc::transport::ParkDoor;
  ParkDoor door;
  door.addr = 0x00007f0000001238;
  door.rkey = 0x12345678;
  door.token = 0x9abcdef0;
  uint8_t bytes[ParkDoor::kSize];
  EncodeParkDoor(door, bytes);
  CHECK(bytes[0] == 0x38);  // little-endian
  CHECK(bytes[12] == 0xf0);
  auto decoded = DecodeParkDoor(bytes);
  REQUIRE(decoded.ok());
  CHECK(*decoded == door);
  CHECK(!DecodeParkDoor(absl::MakeConstSpan(bytes, ParkDoor::kSize - 1)).ok());
  for (uint64_t addr : {uint64_t{0}, uint64_t{0x1004}, ~uint64_t{7}}) {
    ParkDoor bad = door;
    bad.addr = addr;
    EncodeParkDoor(bad, bytes);
    CHECK(!DecodeParkDoor(bytes).ok());
  }
  ParkDoor no_token = door;
  no_token.token = 0;
  EncodeParkDoor(no_token, bytes);
  CHECK(!DecodeParkDoor(bytes).ok());
  CHECK(zrpc::transport::KnockValue(0x9abcdef0, 7) == 0x9abcdef000000007ull);
}

TEST_CASE("park and parked frames carry nothing", "[wire]") {
  uint8_t buf[16] = {};
  for (FrameKind kind : {FrameKind::kPark, FrameKind::kParked}) {
    FrameHeader h;
    h.credits = 2;
    h.kind = kind;
    EncodeFrameHeader(h, buf);
    auto decoded = DecodeFrameHeader(absl::MakeConstSpan(buf, FrameHeader::kSize));
    REQUIRE(decoded.ok());
    CHECK(decoded->kind == kind);
    CHECK(decoded->credits == 2);
    CHECK(!DecodeFrameHeader(absl::MakeConstSpan(buf, FrameHeader::kSize + 1)).ok());
  }
}
