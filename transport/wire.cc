#include "transport/wire.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport/arena.h"
#include "transport/byte_order.h"
#include "transport/credits.h"

namespace zrpc::transport {
namespace {

absl::Status Refuse(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("zrpc handshake: ", why));
}

}  // namespace

bool Hello::operator==(const Hello& o) const {
  return version == o.version && flags == o.flags && recv_credits == o.recv_credits &&
         recv_size == o.recv_size && arena_addr == o.arena_addr && arena_rkey == o.arena_rkey &&
         arena_size == o.arena_size && max_recv_credits == o.max_recv_credits;
}

void EncodeHello(const Hello& h, uint8_t* out) {
  PutLe<uint32_t>(out + 0, kWireMagic);
  PutLe<uint16_t>(out + 4, h.version);
  PutLe<uint16_t>(out + 6, h.flags);
  PutLe<uint32_t>(out + 8, h.recv_credits);
  PutLe<uint32_t>(out + 12, h.recv_size);
  PutLe<uint64_t>(out + 16, h.arena_addr);
  PutLe<uint32_t>(out + 24, h.arena_rkey);
  PutLe<uint32_t>(out + 28, h.arena_size);
  PutLe<uint32_t>(out + 32, h.max_recv_credits);
}

absl::StatusOr<Hello> DecodeHello(absl::Span<const uint8_t> bytes) {
  // A magic check needs 4 bytes; say "not zrpc" rather than "too short" when even those differ.
  if (const uint32_t magic = bytes.size() >= 4 ? GetLe<uint32_t>(bytes.data()) : kWireMagic;
      magic != kWireMagic) {
    return Refuse(absl::StrCat("peer is not zrpc (magic 0x", absl::Hex(magic), ", expected 0x",
                               absl::Hex(kWireMagic), ")"));
  }
  if (bytes.size() < Hello::kSize) {
    return Refuse(absl::StrCat("peer sent ", bytes.size(), " bytes of connection data, expected ",
                               Hello::kSize));
  }
  const uint8_t* in = bytes.data();
  Hello h;
  h.version = GetLe<uint16_t>(in + 4);
  h.flags = GetLe<uint16_t>(in + 6);
  h.recv_credits = GetLe<uint32_t>(in + 8);
  h.recv_size = GetLe<uint32_t>(in + 12);
  h.arena_addr = GetLe<uint64_t>(in + 16);
  h.arena_rkey = GetLe<uint32_t>(in + 24);
  h.arena_size = GetLe<uint32_t>(in + 28);
  h.max_recv_credits = GetLe<uint32_t>(in + 32);
  if (h.version != kWireVersion) {
    return Refuse(
        absl::StrCat("peer speaks wire version ", h.version, ", this build speaks ", kWireVersion));
  }
  if ((h.flags & ~(kHelloArenaOnDemand | kHelloParks | kHelloAuth)) != 0) {
    return Refuse(absl::StrCat("peer sets unknown flags 0x", absl::Hex(h.flags)));
  }
  // Fewer could deadlock the credit scheme (credits.h); none is a parked start, which only a
  // side that can open a parked window may offer.
  const bool parked = h.recv_credits == 0 && (h.flags & kHelloParks) != 0;
  // One: an accepting side that authenticates, until the client's tag is checked (auth.h). Which
  // side may offer it is the handshake's to check (the client's window is never provisional).
  const bool provisional = h.recv_credits == 1 && (h.flags & kHelloAuth) != 0;
  if (!parked && !provisional && (h.recv_credits < kMinCredits || h.recv_credits > kMaxCredits)) {
    return Refuse(absl::StrCat("peer offers ", h.recv_credits, " receive credits, not in [",
                               kMinCredits, ", ", kMaxCredits, "]"));
  }
  const uint32_t least = std::max(h.recv_credits, kMinCredits);
  if (h.max_recv_credits < least || h.max_recv_credits > kMaxCredits) {
    return Refuse(absl::StrCat("peer's window may reach ", h.max_recv_credits,
                               " receive credits, not in [", least, ", ", kMaxCredits, "]"));
  }
  if (h.recv_size < FrameHeader::kSize) {
    return Refuse(absl::StrCat("peer's receive size ", h.recv_size, " cannot hold a frame header"));
  }
  if (h.arena_size % kArenaAlign != 0 || h.arena_size > kMaxArenaSize) {
    return Refuse(absl::StrCat("peer's arena of ", h.arena_size, " bytes is not a multiple of ",
                               kArenaAlign, " up to 1 GiB"));
  }
  if (h.arena_size > 0 && h.arena_addr + h.arena_size < h.arena_addr) {
    return Refuse("peer's arena wraps around the address space");
  }
  if ((h.flags & kHelloArenaOnDemand) != 0 &&
      (h.arena_size == 0 || h.arena_addr != 0 || h.arena_rkey != 0)) {
    return Refuse("peer lends an arena on demand but gives no size, or an address or key already");
  }
  if ((h.flags & kHelloAuth) != 0 && (h.arena_addr != 0 || h.arena_rkey != 0)) {
    return Refuse("peer authenticates but gives its arena's address or key before its tag");
  }
  return h;
}

absl::Status CheckPeerReceives(const Hello& peer, uint32_t min_message_size) {
  if (peer.recv_size >= FrameHeader::kSize + uint64_t{min_message_size}) return absl::OkStatus();
  return Refuse(absl::StrCat("the peer's receives of ", peer.recv_size, " bytes cannot carry the ",
                             min_message_size, "-byte messages this side needs (plus the ",
                             FrameHeader::kSize, "-byte frame header)"));
}

void EncodeFrameHeader(const FrameHeader& header, uint8_t* out) {
  PutLe<uint32_t>(out + 0, header.arena_released);
  PutLe<uint16_t>(out + 4, header.credits);
  out[6] = static_cast<uint8_t>(header.kind);
  out[7] = 0;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < FrameHeader::kSize) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer sent a ", bytes.size(), "-byte message, shorter than the frame header"));
  }
  FrameHeader header;
  header.arena_released = GetLe<uint32_t>(bytes.data());
  header.credits = GetLe<uint16_t>(bytes.data() + 4);
  uint8_t kind = bytes[6];
  if (kind < static_cast<uint8_t>(FrameKind::kData) ||
      kind > static_cast<uint8_t>(FrameKind::kAuthOk)) {
    return absl::FailedPreconditionError(absl::StrCat("peer sent a frame of unknown kind ", kind));
  }
  if (bytes[7] != 0) return absl::FailedPreconditionError("peer set the frame's reserved byte");
  header.kind = static_cast<FrameKind>(kind);
  if (header.kind == FrameKind::kCredit && bytes.size() != FrameHeader::kSize) {
    return absl::FailedPreconditionError("peer sent a credit update with a payload");
  }
  if ((header.kind == FrameKind::kPark || header.kind == FrameKind::kParked) &&
      bytes.size() != FrameHeader::kSize) {
    return absl::FailedPreconditionError("peer sent a park frame with a payload");
  }
  if (header.kind == FrameKind::kArena &&
      bytes.size() != FrameHeader::kSize + ArenaMessage::kSize) {
    return absl::FailedPreconditionError(absl::StrCat("peer sent an arena message of ",
                                                      bytes.size() - FrameHeader::kSize,
                                                      " bytes, not ", ArenaMessage::kSize));
  }
  if ((header.kind == FrameKind::kAuth && bytes.size() != FrameHeader::kSize + kAuthFramePayload) ||
      (header.kind == FrameKind::kAuthOk &&
       bytes.size() != FrameHeader::kSize + kAuthOkFramePayload)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer sent an authentication frame of ", bytes.size() - FrameHeader::kSize, " bytes, not ",
        header.kind == FrameKind::kAuth ? kAuthFramePayload : kAuthOkFramePayload));
  }
  return header;
}

bool ArenaMessage::operator==(const ArenaMessage& o) const {
  return op == o.op && loan == o.loan && addr == o.addr && rkey == o.rkey && size == o.size;
}

void EncodeArenaMessage(const ArenaMessage& m, uint8_t* out) {
  out[0] = static_cast<uint8_t>(m.op);
  out[1] = out[2] = out[3] = 0;
  PutLe<uint32_t>(out + 4, m.loan);
  PutLe<uint64_t>(out + 8, m.addr);
  PutLe<uint32_t>(out + 16, m.rkey);
  PutLe<uint32_t>(out + 20, m.size);
}

absl::StatusOr<ArenaMessage> DecodeArenaMessage(absl::Span<const uint8_t> bytes) {
  auto bad = [](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("peer sent a bad arena message: ", why));
  };
  if (bytes.size() != ArenaMessage::kSize) return bad("wrong length");
  const uint8_t* in = bytes.data();
  if (in[0] < static_cast<uint8_t>(ArenaOp::kAsk) ||
      in[0] > static_cast<uint8_t>(ArenaOp::kReturned)) {
    return bad(absl::StrCat("unknown op ", in[0]));
  }
  if (in[1] != 0 || in[2] != 0 || in[3] != 0) return bad("reserved bytes set");
  ArenaMessage m;
  m.op = static_cast<ArenaOp>(in[0]);
  m.loan = GetLe<uint32_t>(in + 4);
  m.addr = GetLe<uint64_t>(in + 8);
  m.rkey = GetLe<uint32_t>(in + 16);
  m.size = GetLe<uint32_t>(in + 20);
  if (m.op == ArenaOp::kLend) {
    if (m.size == 0 || m.size % kArenaAlign != 0 || m.size > kMaxArenaSize) {
      return bad(absl::StrCat("a loan of ", m.size, " bytes"));
    }
    if (m.addr + m.size < m.addr) return bad("a loan that wraps around the address space");
  } else if (m.addr != 0 || m.rkey != 0 || m.size != 0) {
    return bad("address, key or size set on an op that has none");
  }
  if ((m.op == ArenaOp::kAsk) != (m.loan == 0)) {
    return bad(m.op == ArenaOp::kAsk ? "an ask names a loan" : "loan 0");
  }
  return m;
}

}  // namespace zrpc::transport

namespace zrpc::transport {

bool ParkDoor::operator==(const ParkDoor& o) const {
  return addr == o.addr && rkey == o.rkey && token == o.token;
}

void EncodeParkDoor(const ParkDoor& door, uint8_t* out) {
  PutLe<uint64_t>(out + 0, door.addr);
  PutLe<uint32_t>(out + 8, door.rkey);
  PutLe<uint32_t>(out + 12, door.token);
}

absl::StatusOr<ParkDoor> DecodeParkDoor(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < ParkDoor::kSize) return Refuse("the accept reply has no park door");
  ParkDoor door;
  door.addr = GetLe<uint64_t>(bytes.data());
  door.rkey = GetLe<uint32_t>(bytes.data() + 8);
  door.token = GetLe<uint32_t>(bytes.data() + 12);
  if (door.addr == 0 || door.addr % 8 != 0 || door.addr + 8 < door.addr) {
    return Refuse(absl::StrCat("peer's park door at 0x", absl::Hex(door.addr),
                               " is not an 8-aligned address"));
  }
  if (door.token == 0) return Refuse("peer's park door has no token");
  return door;
}

uint64_t KnockValue(uint32_t token, uint32_t knock) { return (uint64_t{token} << 32) | knock; }

}  // namespace zrpc::transport
