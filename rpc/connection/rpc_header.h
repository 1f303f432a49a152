// The RPC header: the first 32 bytes of every transport message the RPC runtime sends, right
// after the transport's own 8-byte frame header (transport/wire.h). rpc/WIRE.md has the layout
// table; this file is its codec.
//
//   [frame header, 8 B][RpcHeader, 32 B][body: protobuf request/response, error message, nothing]
//
// The header says what the message is (kind), which call it belongs to (call id), where a
// request goes (service id, method index), how long the caller still waits (timeout, in
// remaining microseconds: clocks differ between hosts, so absolute deadlines never travel), and
// whether a bulk payload belongs to it (flag and size). Integers are little-endian, written
// byte by byte like the transport's, so the layout does not depend on the compiler.
//
// No magic and no version here: the transport's Hello (transport/wire.h) already refuses a peer
// with another wire version before any RPC message flows, and kWireVersion covers this layout.
// A change to it bumps transport::kWireVersion (or claims a Hello flag bit for a feature).
//
// Bulk pairing. A message with kRpcFlagBulk set has exactly one bulk payload of bulk_size bytes,
// which arrived as a bulk WRITE_WITH_IMM on the same connection immediately before it (OnBulk,
// then OnMessage). RC delivers in order and the transport keeps a payload and its message in its
// FIFO, so the receiver pairs by order: it holds at most one unpaired payload per connection, and
// the next message must claim it (flag set, bulk_size equal to the payload's length). A second
// payload before a message, a message with the flag and no payload, or a payload followed by a
// message without the flag breaks the protocol. The sender must post a payload and its message
// back to back, with no other message of the connection in between (one send lock around both).
//
// Decoding trusts nothing: DecodeRpcHeader checks every field against the kind before the
// runtime uses any of it, and refuses with kFailedPrecondition naming the field. The runtime
// disconnects such a peer, quoting the message.
#ifndef ZRPC_RPC_CONNECTION_RPC_HEADER_H_
#define ZRPC_RPC_CONNECTION_RPC_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "rpc/metadata.h"
#include "transport/wire.h"

namespace zrpc {

// Values 9..15 are reserved; a receiver refuses them like any unknown kind. A stream (WIRE.md,
// "Streams") is opened by a request with kRpcFlagStream and ended by a response or an error,
// like a unary call; kinds 6-8 travel in between.
enum class RpcKind : uint8_t {
  kRequest = 1,   // client -> server: a call. Body: the serialized request.
  kResponse = 2,  // server -> client: the call succeeded. Body: the serialized response.
  kError = 3,     // server -> client: the call failed. Body: the status message (bounded).
  kCancel = 4,    // client -> server: the caller gave up on the call (deadline, cancel). No body.
  kPulled = 5,    // both ways: the payload a message of the call exposed was pulled (or never will
                  // be): its sender may stop exposing it. No body.
  kStreamMessage = 6,  // both ways, on an open stream: one message. Body: the serialized message.
  kHalfClose = 7,      // client -> server: the client sends no more messages. No body.
  kStreamCredit = 8,   // both ways: the sender may send `window` more messages. No body.
};

// flags: a bulk payload belongs to this message (WIRE.md, "Bulk payloads").
inline constexpr uint8_t kRpcFlagBulk = 0x01;
// flags, with kRpcFlagBulk: the payload was not written into the receiver's arena; the receiver
// pulls it by RDMA READ from the range the PullDescriptor at the end of the body names.
inline constexpr uint8_t kRpcFlagPull = 0x02;
// flags, requests only: the caller wants the response's payload exposed for pulling whatever its
// size (it lands in memory the caller chose: CallOptions::response_destination).
inline constexpr uint8_t kRpcFlagPullResponse = 0x04;

// flags, with kRpcFlagBulk, requests and responses: the message's body did not fit a receive
// slot and travels at the front of the payload instead (WIRE.md, "Messages larger than a slot").
// The SEND's body is then a LargeBody trailer (and the pull descriptors, if pulled).
inline constexpr uint8_t kRpcFlagLargeBody = 0x08;
// flags, requests only: the request opens a stream (a streaming method); `window` is how many
// messages the client takes before it grants more (WIRE.md, "Streams").
inline constexpr uint8_t kRpcFlagStream = 0x10;
// flags, requests (stream opens too), responses and errors: the SEND's body starts with a
// metadata block (WIRE.md, "Metadata"): the client's metadata on a request, the handler's
// trailing metadata (and an error's status payloads) on the answer.
inline constexpr uint8_t kRpcFlagMetadata = 0x20;

// The metadata block: a 4-byte size, then entries of [type (1), key size (1), value size (2),
// key, value]. Type 0 is a metadata entry (metadata.h's rules), type 1 an error's status payload
// (absl::Status::SetPayload: the key its type URL, printable ASCII). At most
// Metadata::kMaxSize bytes of entries.
struct MetadataBlock {
  static constexpr size_t kPrefix = 4;
  static constexpr uint8_t kEntry = 0;
  static constexpr uint8_t kStatusPayload = 1;
};
// Bytes of the block holding `metadata` (may be null) and the payloads of `status` (may be null
// or OK) that fit beside it: 0 when there is nothing to send. `*payloads_dropped` (if set) says
// whether some payload did not fit kMaxSize and will not travel.
size_t MetadataBlockSize(const Metadata* metadata, const absl::Status* status,
                         bool* payloads_dropped = nullptr);
// Writes that block (MetadataBlockSize bytes, which must be nonzero) at `out`.
void EncodeMetadataBlock(const Metadata* metadata, const absl::Status* status, uint8_t* out);
// Decodes the entries of a block (MessageLayout::metadata) into `*metadata` and, into `*status`
// (if set; a non-OK status), the status payloads. kFailedPrecondition naming what is wrong: a
// truncated entry, an unknown type, a key or value that breaks metadata.h's rules, a status
// payload outside an error (`status` null).
absl::Status DecodeMetadataBlock(absl::Span<const uint8_t> entries, Metadata* metadata,
                                 absl::Status* status);

// With kRpcFlagLargeBody: how many of the payload's bulk_size bytes are the message's body (the
// rest, if any, is the bulk payload the method carries).
struct LargeBody {
  static constexpr size_t kSize = 8;  // size (4 bytes), 4 reserved bytes (zero)
};
void EncodeLargeBody(uint32_t body_size, uint8_t* out);

// Where a payload to pull lies in the sender's memory, exposed for RDMA READ for this call only:
// the last kSize bytes of the body of a message with kRpcFlagPull. The payload's length is the
// header's bulk_size.
struct PullDescriptor {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t flags = 0;  // kPullWindow, or 0; no other bit is defined

  static constexpr size_t kSize = 16;  // addr, rkey, flags
};
// PullDescriptor::flags: the key is a memory window's, bound to the connection's queue pair
// (transport/exposures.h). The reader's kPulled for the message must then be a SEND_WITH_INV of
// the first descriptor's key, which ends the exposure on the sender's NIC (WIRE.md, "Pulled
// payloads"). A message's two descriptors carry the same flags.
inline constexpr uint32_t kPullWindow = 0x1;
void EncodePullDescriptor(const PullDescriptor& descriptor, uint8_t* out);
// kFailedPrecondition when `bytes` is not kSize long or its flags have a bit other than
// kPullWindow set.
absl::StatusOr<PullDescriptor> DecodePullDescriptor(absl::Span<const uint8_t> bytes);

// The longest status message an error carries, in bytes. A sender truncates a longer one (with
// kTruncatedMarker); a receiver refuses an error whose body exceeds it. 1 KiB holds a useful
// explanation and keeps an error in one small SEND (the default RECV is 4 KiB; a sender facing
// smaller RECVs passes a lower limit to ErrorBodySize / EncodeErrorBody).
inline constexpr size_t kMaxErrorMessage = 1024;
inline constexpr absl::string_view kTruncatedMarker = "...[truncated]";

struct RpcHeader {
  RpcKind kind = RpcKind::kRequest;
  uint8_t flags = 0;
  // Requests only (0 otherwise): index in the service's method table (MethodInfo::index).
  uint16_t method_index = 0;
  // Requests only (0 otherwise): ServiceId(full name of the service).
  uint32_t service_id = 0;
  // Every kind; never 0. A response, error or cancel carries its request's id.
  uint64_t call_id = 0;
  // Requests: microseconds the caller still waits, 0 = no deadline. kPulled: the address the
  // pulled message's first descriptor named (pulled_addr), which tells a stream's messages
  // apart. 0 otherwise.
  uint64_t timeout_us = 0;
  // Bytes of the bulk payload: nonzero exactly when flags has kRpcFlagBulk. Requests and
  // responses only. 32 bits: a payload written into the arena is at most 1 GiB
  // (transport/arena.h), a pulled one at most 4 GiB - 1.
  uint32_t bulk_size = 0;
  // Errors only (kOk otherwise, never kOk in an error).
  absl::StatusCode status_code = absl::StatusCode::kOk;
  // Stream opens (requests with kRpcFlagStream) and credits only, never 0 there (0 otherwise):
  // messages the receiver of this header may send on the stream, beyond those granted before.
  uint16_t window = 0;

  static constexpr size_t kSize = 32;

  bool has_bulk() const { return (flags & kRpcFlagBulk) != 0; }
  bool pulls() const { return (flags & kRpcFlagPull) != 0; }
  bool large_body() const { return (flags & kRpcFlagLargeBody) != 0; }
  bool opens_stream() const { return (flags & kRpcFlagStream) != 0; }
  uint64_t pulled_addr() const { return timeout_us; }
  bool operator==(const RpcHeader& other) const;
  bool operator!=(const RpcHeader& other) const { return !(*this == other); }

  // Well-formed headers of each kind; DecodeRpcHeader accepts what these build.
  static RpcHeader Request(uint32_t service_id, uint16_t method_index, uint64_t call_id,
                           uint64_t timeout_us, uint32_t bulk_size = 0);
  static RpcHeader Response(uint64_t call_id, uint32_t bulk_size = 0);
  static RpcHeader Error(uint64_t call_id, absl::StatusCode code);
  static RpcHeader Cancel(uint64_t call_id);
  // `addr`: the first PullDescriptor::addr of the message pulled (its sender's key for it).
  static RpcHeader Pulled(uint64_t call_id, uint64_t addr);
  static RpcHeader StreamOpen(uint32_t service_id, uint16_t method_index, uint64_t call_id,
                              uint64_t timeout_us, uint16_t window);
  static RpcHeader StreamMessage(uint64_t call_id);
  static RpcHeader HalfClose(uint64_t call_id);
  static RpcHeader StreamCredit(uint64_t call_id, uint16_t window);
};

// Writes `header` into `out`, which must hold RpcHeader::kSize bytes. The header is written as
// given: build it with the factories above so the peer accepts it.
void EncodeRpcHeader(const RpcHeader& header, uint8_t* out);

// Parses and checks the header of a received message of `message.size()` bytes (the transport
// payload: this header and the body after it). kFailedPrecondition, naming the field, when the
// message is shorter than the header, the kind is unknown, reserved bits or bytes are set, a
// field another kind owns is nonzero, the call id is 0, the flag and bulk_size disagree, the
// status code is outside absl's range or kOk in an error, an error's body exceeds
// kMaxErrorMessage, or a cancel has a body. What it cannot check is the runtime's: that the
// service and method exist, that a paired payload exists and has bulk_size bytes, and that the
// method takes a payload.
absl::StatusOr<RpcHeader> DecodeRpcHeader(absl::Span<const uint8_t> message);

// Where the parts of a request or response are (WIRE.md): the body in the SEND or at the
// front of the payload, and the payload written into the arena or to pull from the ranges
// named, in the payload's order (with a large body and a bulk payload, the body's range and the
// bulk's: they lie apart in the sender's memory).
struct MessageLayout {
  absl::Span<const uint8_t> body;  // the body inside the SEND; empty with a large body
  // The metadata block's entries (without its size), with kRpcFlagMetadata; else empty.
  absl::Span<const uint8_t> metadata;
  uint32_t payload_body = 0;  // bytes of body at the front of the payload
  PullDescriptor pulls[2];
  int pull_count = 0;
  // The key the reader's kPulled must invalidate (SEND_WITH_INV) once it no longer reads, or 0:
  // the first descriptor's key when it is a window's (kPullWindow). Kept after the pull is done.
  uint32_t invalidate_rkey = 0;
  // Bytes of the bulk payload the method carries (the payload less the body in it).
  uint32_t bulk_size(const RpcHeader& header) const;
};

// The layout of the body of `message`, whose header DecodeRpcHeader returned as `header`.
// kFailedPrecondition when a large body's trailer is malformed (reserved bytes set, a size of 0
// or past bulk_size), the body is not exactly the trailer and descriptors the flags call for,
// or a descriptor has flags other than kPullWindow, or two descriptors' flags differ.
absl::StatusOr<MessageLayout> DecodeLayout(const RpcHeader& header,
                                           absl::Span<const uint8_t> message);

// The body of an error message: `message` itself when it fits in `limit` bytes (at most
// kMaxErrorMessage; a larger limit counts as kMaxErrorMessage), otherwise its start, cut on a
// UTF-8 character boundary, and kTruncatedMarker (or as much of the marker as fits).
size_t ErrorBodySize(absl::string_view message, size_t limit = kMaxErrorMessage);
// Writes that body into `out` (ErrorBodySize(message, limit) bytes) and returns its size.
size_t EncodeErrorBody(absl::string_view message, uint8_t* out, size_t limit = kMaxErrorMessage);
// The status a peer reported in an error message: `header.status_code` (which DecodeRpcHeader
// checked is a valid non-OK code) with `body` as its message. kFailedPrecondition when `header`
// is not an error or `body` is longer than kMaxErrorMessage; the reported status is in `*peer`.
absl::Status DecodeErrorBody(const RpcHeader& header, absl::Span<const uint8_t> body,
                             absl::Status* peer);

// FNV-1a, 32 bits, of a service's full name ("package.Service"): its id on the wire. Stable
// across builds and languages. A server refuses to add a service whose id collides with one it
// already has, or is 0 (the value that means "no service" outside requests).
constexpr uint32_t ServiceId(absl::string_view full_name) {
  uint32_t hash = 2166136261u;  // FNV offset basis
  for (size_t i = 0; i < full_name.size(); ++i) {
    hash ^= static_cast<uint8_t>(full_name[i]);
    hash *= 16777619u;  // FNV prime
  }
  return hash;
}

// A call's deadline on the wire, on monotonic nanoseconds (rpc/common/monotonic.h): integer
// arithmetic only, as the runtime's hot path wants.
//
// TimeoutToWireNanos: the timeout a request carries for a call ending at `deadline_nanos`, seen
// at `now_nanos` (the caller sends 0, "none", for a call without a deadline): the remaining
// microseconds rounded up, at least 1 (a deadline that has just passed must not read as "no
// deadline"; the runtime fails such calls locally before sending).
//
// DeadlineNanosFromWire: the deadline a server gives a request that arrived at `now_nanos` with
// `timeout_us`: INT64_MAX (none) for 0 and for a deadline past that range. The transit time is
// not subtracted (it is unknown without synchronized clocks): the server's deadline is slightly
// later than the client's, and the client's own timer is the one that ends the call.
uint64_t TimeoutToWireNanos(int64_t deadline_nanos, int64_t now_nanos);
int64_t DeadlineNanosFromWire(uint64_t timeout_us, int64_t now_nanos);

// The RPC layer's accept data (WIRE.md, "Accept data"): what a server tells a client in its
// accept reply. Bytes 0-3: the idle keepalive interval it asks for, in milliseconds (0: no
// advice), as its answers to pings carry it; the rest reserved, zero.
transport::AcceptData EncodeAcceptData(uint32_t idle_interval_ms);
uint32_t AcceptDataIdleIntervalMs(const transport::AcceptData& data);

}  // namespace zrpc

#endif  // ZRPC_RPC_CONNECTION_RPC_HEADER_H_
