// The transport's wire format: what two zrpc peers exchange below the RPC layer.
//
// Three things cross the wire, and nothing else:
//
// 1. Hello (36 bytes), in the private data of the librdmacm connect request and of the accept
//    reply. Each side tells the other how to send to it:
//
//      offset size field
//       0     4    magic        0x5a525043 ("ZRPC" read as a little-endian u32)
//       4     2    version      kWireVersion; a peer with another version is refused
//       6     2    flags        bit 0 (kHelloArenaOnDemand): the arena is lent on demand (below);
//                               bit 1 (kHelloParks): the sender may park the peer's window
//                               (kPark frames, below), and its accept reply carries a ParkDoor
//                               (with kHelloAuth, its kAuthOk frame does);
//                               bit 2 (kHelloAuth): the sender authenticates (auth.h): its arena
//                               address and key come in its first frame (kAuth, kAuthOk), not
//                               here (both 0); from the accepting side, recv_credits is 1 until
//                               the client's tag is checked;
//                               the other bits are reserved, zero
//       8     4    recv_credits RECVs the sender of this Hello has posted for the peer: how many
//                               SENDs and WRITE_WITH_IMMs the peer may have in flight before
//                               credits return (its initial window, at least 3; 0 with
//                               kHelloParks: the peer starts parked; 1 with kHelloAuth from the
//                               accepting side: room for the client's kAuth frame alone)
//      12     4    recv_size    bytes each of those RECVs holds: the largest SEND it accepts
//      16     8    arena_addr   virtual address of the receive arena the peer may RDMA WRITE into
//                               (0 when lent on demand)
//      24     4    arena_rkey   its rkey (REMOTE_WRITE only; 0 when lent on demand)
//      28     4    arena_size   its size in bytes (0: no arena, bulk payloads are refused); lent on
//                               demand, the size of every loan
//      32     4    max_recv_credits  the most credits the sender of this Hello may ever have
//                               granted at once (>= recv_credits): a receiver whose window is
//                               elastic (credits.h) returns more credits than were spent while it
//                               grows it, and fewer while it shrinks it; equal for a fixed window
//
//    All integers are little-endian, encoded byte by byte (never by memcpy of a struct), so the
//    format does not depend on the compiler's layout. The InfiniBand CM carries at most 56 bytes
//    in a connect request (RDMA_PS_TCP); Hello leaves 20, which an AuthRequest fills (auth.h:
//    key id and client nonce; zeros when the client presents no key). A refusal
//    (rdma_reject) carries a short text saying why, so the connecting side can say it too.
//
//    The accept reply carries kAcceptDataSize more bytes after its Hello (at offset kSize: a
//    version whose Hello grows moves them, and says so by its version): the server's upper
//    layer's, opaque here (Placement::accept_data; rpc/WIRE.md says what the RPC layer puts
//    there), zero when it gives none. The CM's reply has room for 196 bytes and pads what it
//    carries with zeros, so a reader cannot tell bytes absent from zeros: zero must mean "none".
//    An older client ignores them (DecodeHello reads kSize bytes); an older server's reply reads
//    as zeros.
//
//    An accepting side that authenticates puts an AuthReply (48 bytes: its nonce and tag, auth.h)
//    at offset kSize + kAcceptDataSize. Otherwise, with kHelloParks, a ParkDoor (16 bytes) is
//    there: where the client knocks to have a parked window opened again (credits.h, "Parked
//    windows"):
//
//      offset size field
//       0     8    addr         virtual address of this connection's door: 8 bytes, 8-aligned
//       8     4    rkey         its key (REMOTE_WRITE; the doors of one poller share it)
//      12     4    token        nonzero, random: what the client's knocks carry
//
//    A knock is an 8-byte RDMA WRITE (no immediate: it consumes no receive) of token << 32 | n,
//    little-endian, n counting the client's knocks from 1 (wrapping past 0). The server arms each
//    door with a random value it tells no one and hears any write that changes it; one without
//    the token is counted as foreign (park_doors.h). A client knocks once per park: the server's
//    grant ends it, and a kPark starts the next.
//
// 2. Frames: every SEND starts with an 8-byte FrameHeader, followed by the caller's payload:
//
//      offset size field
//       0     4    arena_released  total bytes of the sender's receive arena released so far,
//                                  modulo 2^32 (cumulative, so a lost or repeated update is
//                                  harmless and the receiver only needs the latest)
//       4     2    credits         RECVs the sender re-posted since its previous frame
//       6     1    kind            1: data (payload follows), 2: credit update (no payload),
//                                  3: arena loan message (an ArenaMessage follows),
//                                  4: park (no payload; server to client: give your credits
//                                  back), 5: parked (no payload; the answer: every credit the
//                                  client held beyond the one this frame spends is given up),
//                                  6: auth (client to server, the first frame of a connection
//                                  that authenticates: an AuthFrame follows, auth.h), 7: auth ok
//                                  (the server's answer, its first frame: an AuthOkFrame follows)
//       7     1    reserved        0
//
//    An arena loan message (kArena, 24 bytes after the header) is how an arena lent on demand
//    (arena.h, "Loans") is asked for, lent, called back and given back:
//
//      offset size field
//       0     1    op              1: ask (writer to reader), 2: lend, 3: recall (reader to
//       writer),
//                                  4: returned (writer to reader)
//       1     3    reserved        0
//       4     4    loan            the loan it is about (lend, recall, returned), 0 for ask
//       8     8    addr            lend: the arena's virtual address; else 0
//      16     4    rkey            lend: a memory window's key, bound to this connection's QP
//      20     4    size            lend: the arena's size, Hello.arena_size; else 0
//
//    It spends a credit as a data frame does (two available), and its RECV is owed back at once.
//
// 3. Bulk payloads: an RDMA WRITE_WITH_IMM into the receiver's arena. The 32-bit immediate is
//    the byte offset in the arena where the payload starts, with bit 31 set when the writer
//    restarted the ring (arena.h); the completion's byte_len is its length. It consumes one RECV
//    credit like a SEND. Offsets follow a ring discipline both sides compute (arena.h), so the
//    receiver can check every offset the peer claims.
#ifndef ZRPC_TRANSPORT_WIRE_H_
#define ZRPC_TRANSPORT_WIRE_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zrpc::transport {

inline constexpr uint32_t kWireMagic = 0x5a525043;  // "ZRPC"
// 2: the RPC layer's pulled payloads, 3: large bodies, 4: streams (rpc/WIRE.md); 5: elastic
// receive windows (Hello.max_recv_credits, credits.h); 6: arenas lent on demand (kArena frames,
// Hello flag kHelloArenaOnDemand); 7: parked windows (kPark and kParked frames, Hello flag
// kHelloParks, the ParkDoor); 8: peer authentication (Hello flag kHelloAuth, the AuthRequest and
// AuthReply, kAuth and kAuthOk frames: auth.h); 9: the RPC layer's pulled payloads exposed
// through memory windows (rpc/WIRE.md: the pull descriptor's flags; SEND_WITH_INV, exposures.h);
// 10: the RPC layer's metadata (rpc/WIRE.md, "Metadata"), which a version-9 peer would refuse as
// an unknown flag mid-call: refused at the handshake instead; 11: the RPC layer's stream messages
// pulled, and its kPulled naming the payload's address.
inline constexpr uint16_t kWireVersion = 11;
// Hello.flags bit 0: the sender's arena is lent on demand, by kArena frames.
inline constexpr uint16_t kHelloArenaOnDemand = 1;
// Hello.flags bit 1: the sender may park the peer's window (kPark), and its accept reply carries
// a ParkDoor after the accept data.
inline constexpr uint16_t kHelloParks = 2;
// Hello.flags bit 2: the sender authenticates (auth.h): no arena address or key in its Hello
// (they come in its kAuth or kAuthOk frame), and from the accepting side, one credit until the
// client's tag is checked.
inline constexpr uint16_t kHelloAuth = 4;
// The upper layer's bytes after the Hello in an accept reply (above).
inline constexpr size_t kAcceptDataSize = 32;
using AcceptData = std::array<uint8_t, kAcceptDataSize>;
// What librdmacm lets a connect request carry (RDMA_PS_TCP over the IB CM).
inline constexpr size_t kMaxConnectPrivateData = 56;

struct Hello {
  uint16_t version = kWireVersion;
  uint16_t flags = 0;
  uint32_t recv_credits = 0;
  uint32_t recv_size = 0;
  uint64_t arena_addr = 0;
  uint32_t arena_rkey = 0;
  uint32_t arena_size = 0;
  uint32_t max_recv_credits = 0;

  static constexpr size_t kSize = 36;
  bool operator==(const Hello& other) const;
};

// Writes `hello` (with the magic) into `out`, which must hold Hello::kSize bytes.
void EncodeHello(const Hello& hello, uint8_t* out);

// Parses a peer's Hello. FailedPrecondition, with a message fit to show the user, when the bytes
// are too short, the magic or version differ, reserved flags are set, or the numbers cannot be
// right (no credits, a RECV too small for a frame header). Bytes past kSize are ignored: later
// versions may append fields.
absl::StatusOr<Hello> DecodeHello(absl::Span<const uint8_t> bytes);

// Whether a peer whose Hello is `peer` can receive the messages this side's upper layer needs:
// its RECVs must hold a frame header plus `min_message_size` bytes. FailedPrecondition, naming
// both sizes, when they cannot; the handshake is then refused (ConnectionOptions).
absl::Status CheckPeerReceives(const Hello& peer, uint32_t min_message_size);

// Where a parked client knocks (above); in the accept reply after the accept data.
struct ParkDoor {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t token = 0;

  static constexpr size_t kSize = 16;
  static constexpr size_t kOffset = Hello::kSize + kAcceptDataSize;  // in the accept reply
  bool operator==(const ParkDoor& other) const;
};
void EncodeParkDoor(const ParkDoor& door, uint8_t* out);
// FailedPrecondition when the address is 0, not 8-aligned or wraps, or the token is 0.
absl::StatusOr<ParkDoor> DecodeParkDoor(absl::Span<const uint8_t> bytes);
// A knock's 8 bytes (above), as a number: the token and the knock's count.
uint64_t KnockValue(uint32_t token, uint32_t knock);

enum class FrameKind : uint8_t {
  kData = 1,
  kCredit = 2,
  kArena = 3,
  kPark = 4,
  kParked = 5,
  kAuth = 6,
  kAuthOk = 7,
};

// The payloads of the authentication frames (auth.h: AuthFrame, AuthOkFrame), exactly.
inline constexpr size_t kAuthFramePayload = 44;
inline constexpr size_t kAuthOkFramePayload = 28;

struct FrameHeader {
  uint32_t arena_released = 0;
  uint16_t credits = 0;
  FrameKind kind = FrameKind::kData;

  static constexpr size_t kSize = 8;
};

void EncodeFrameHeader(const FrameHeader& header, uint8_t* out);

// The payload of a kArena frame (see above).
enum class ArenaOp : uint8_t { kAsk = 1, kLend = 2, kRecall = 3, kReturned = 4 };
struct ArenaMessage {
  ArenaOp op = ArenaOp::kAsk;
  uint32_t loan = 0;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t size = 0;

  static constexpr size_t kSize = 24;
  bool operator==(const ArenaMessage& other) const;
};
void EncodeArenaMessage(const ArenaMessage& message, uint8_t* out);
// Parses the payload of a kArena frame: FailedPrecondition when it is not kSize bytes, the op is
// unknown, a reserved byte is set, or a field the op does not use is not zero (a lend's address
// range must not wrap, its size must be a multiple of kArenaAlign up to kMaxArenaSize, not 0).
absl::StatusOr<ArenaMessage> DecodeArenaMessage(absl::Span<const uint8_t> bytes);

// Parses the header of a received SEND of `bytes.size()` bytes. FailedPrecondition when it is
// shorter than the header, the kind is unknown, the reserved byte is set, or a credit update
// carries a payload.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const uint8_t> bytes);

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_WIRE_H_
