// The RPC header codec (rpc/WIRE.md): encode and decode, with every field a peer sends bounded.

#include "rpc/connection/rpc_header.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "transport/byte_order.h"
#include "transport/wire.h"

namespace zrpc {

// This layout is version 11 of the wire, which the transport's Hello negotiates (version 2
// added pulled payloads: kRpcFlagPull and kPulled; version 3 large bodies: kRpcFlagLargeBody;
// version 4 streams: kRpcFlagStream, kinds 6-8 and `window`; versions 5 to 8 changed the
// transport's Hello, connect request, accept reply, credits and frames only, not this header;
// version 9 the pull descriptor's flags, kPullWindow, and the kPulled that invalidates;
// version 10 metadata: kRpcFlagMetadata and its block; version 11 stream messages pulled, and
// the kPulled that names the payload's address);
// when the transport's version moves, decide here whether the RPC header moved with it.
static_assert(transport::kWireVersion == 11, "rpc_header.h describes wire version 11");

namespace {

// Offsets (rpc/WIRE.md).
constexpr size_t kKindAt = 0;
constexpr size_t kFlagsAt = 1;
constexpr size_t kMethodAt = 2;
constexpr size_t kServiceAt = 4;
constexpr size_t kCallIdAt = 8;
constexpr size_t kTimeoutAt = 16;
constexpr size_t kBulkSizeAt = 24;
constexpr size_t kStatusAt = 28;
constexpr size_t kWindowAt = 30;
static_assert(kWindowAt + 2 == RpcHeader::kSize, "the layout fills the header exactly");

constexpr uint16_t kMaxStatusCode = static_cast<uint16_t>(absl::StatusCode::kUnauthenticated);

absl::Status Refuse(absl::string_view field, absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("rpc header: ", field, " ", why));
}

const char* KindName(RpcKind kind) {
  switch (kind) {
    case RpcKind::kRequest:
      return "request";
    case RpcKind::kResponse:
      return "response";
    case RpcKind::kError:
      return "error";
    case RpcKind::kCancel:
      return "cancel";
    case RpcKind::kPulled:
      return "pulled";
    case RpcKind::kStreamMessage:
      return "stream message";
    case RpcKind::kHalfClose:
      return "half-close";
    case RpcKind::kStreamCredit:
      return "stream credit";
  }
  return "unknown";
}

// A field that only requests (or only errors) use is nonzero in another kind: the refusal. The
// callers test for zero themselves, so a well-formed header builds no status (this runs for
// every message).
absl::Status NotZero(const char* field, uint64_t value, RpcKind kind) {
  return Refuse(field, absl::StrCat("is ", value, " in a ", KindName(kind), " (must be 0)"));
}

// How much of `message` an error body keeps, and how much of the marker follows it.
struct Cut {
  size_t keep;
  size_t marker;
};

Cut CutErrorMessage(absl::string_view message, size_t limit) {
  limit = std::min(limit, kMaxErrorMessage);
  if (message.size() <= limit) return {message.size(), 0};
  const size_t marker = std::min(kTruncatedMarker.size(), limit);
  size_t keep = limit - marker;
  // message[keep] is the first byte dropped: if it continues a UTF-8 character, drop that
  // character's leading bytes too, so the body stays valid UTF-8 when the message was.
  while (keep > 0 && (static_cast<uint8_t>(message[keep]) & 0xc0) == 0x80) --keep;
  return {keep, marker};
}

}  // namespace

bool RpcHeader::operator==(const RpcHeader& o) const {
  return kind == o.kind && flags == o.flags && method_index == o.method_index &&
         service_id == o.service_id && call_id == o.call_id && timeout_us == o.timeout_us &&
         bulk_size == o.bulk_size && status_code == o.status_code && window == o.window;
}

RpcHeader RpcHeader::Request(uint32_t service_id, uint16_t method_index, uint64_t call_id,
                             uint64_t timeout_us, uint32_t bulk_size) {
  RpcHeader h;
  h.kind = RpcKind::kRequest;
  h.flags = bulk_size > 0 ? kRpcFlagBulk : 0;
  h.method_index = method_index;
  h.service_id = service_id;
  h.call_id = call_id;
  h.timeout_us = timeout_us;
  h.bulk_size = bulk_size;
  return h;
}

RpcHeader RpcHeader::Response(uint64_t call_id, uint32_t bulk_size) {
  RpcHeader h;
  h.kind = RpcKind::kResponse;
  h.flags = bulk_size > 0 ? kRpcFlagBulk : 0;
  h.call_id = call_id;
  h.bulk_size = bulk_size;
  return h;
}

RpcHeader RpcHeader::Error(uint64_t call_id, absl::StatusCode code) {
  RpcHeader h;
  h.kind = RpcKind::kError;
  h.call_id = call_id;
  h.status_code = code;
  return h;
}

RpcHeader RpcHeader::Cancel(uint64_t call_id) {
  RpcHeader h;
  h.kind = RpcKind::kCancel;
  h.call_id = call_id;
  return h;
}

RpcHeader RpcHeader::Pulled(uint64_t call_id, uint64_t addr) {
  RpcHeader h;
  h.kind = RpcKind::kPulled;
  h.call_id = call_id;
  h.timeout_us = addr;
  return h;
}

RpcHeader RpcHeader::StreamOpen(uint32_t service_id, uint16_t method_index, uint64_t call_id,
                                uint64_t timeout_us, uint16_t window) {
  RpcHeader h = Request(service_id, method_index, call_id, timeout_us);
  h.flags |= kRpcFlagStream;
  h.window = window;
  return h;
}

RpcHeader RpcHeader::StreamMessage(uint64_t call_id) {
  RpcHeader h;
  h.kind = RpcKind::kStreamMessage;
  h.call_id = call_id;
  return h;
}

RpcHeader RpcHeader::HalfClose(uint64_t call_id) {
  RpcHeader h;
  h.kind = RpcKind::kHalfClose;
  h.call_id = call_id;
  return h;
}

RpcHeader RpcHeader::StreamCredit(uint64_t call_id, uint16_t window) {
  RpcHeader h;
  h.kind = RpcKind::kStreamCredit;
  h.call_id = call_id;
  h.window = window;
  return h;
}

void EncodePullDescriptor(const PullDescriptor& d, uint8_t* out) {
  transport::PutLe<uint64_t>(out, d.addr);
  transport::PutLe<uint32_t>(out + 8, d.rkey);
  transport::PutLe<uint32_t>(out + 12, d.flags);
}

absl::StatusOr<PullDescriptor> DecodePullDescriptor(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != PullDescriptor::kSize) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pull descriptor: ", bytes.size(), " bytes (must be ", PullDescriptor::kSize, ")"));
  }
  PullDescriptor d;
  d.addr = transport::GetLe<uint64_t>(bytes.data());
  d.rkey = transport::GetLe<uint32_t>(bytes.data() + 8);
  d.flags = transport::GetLe<uint32_t>(bytes.data() + 12);
  if ((d.flags & ~kPullWindow) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("pull descriptor: flags 0x", absl::Hex(d.flags), " (only 0x1 is defined)"));
  }
  return d;
}

void EncodeLargeBody(uint32_t body_size, uint8_t* out) {
  transport::PutLe<uint32_t>(out, body_size);
  transport::PutLe<uint32_t>(out + 4, 0);
}

uint32_t MessageLayout::bulk_size(const RpcHeader& header) const {
  return header.bulk_size - payload_body;
}

namespace {

// Takes the metadata block off the front of `*body` into `layout->metadata` (DecodeLayout's,
// out of its way: few messages carry metadata).
ABSL_ATTRIBUTE_NOINLINE absl::Status SplitMetadata(const RpcHeader& header,
                                                   absl::Span<const uint8_t>* body_in,
                                                   MessageLayout* layout) {
  absl::Span<const uint8_t>& body = *body_in;
  if (body.size() < MetadataBlock::kPrefix) {
    return Refuse("metadata", absl::StrCat("block: the body has ", body.size(),
                                           " bytes, too few for its size"));
  }
  const uint32_t size = transport::GetLe<uint32_t>(body.data());
  if (size == 0 || size > Metadata::kMaxSize || size > body.size() - MetadataBlock::kPrefix) {
    return Refuse("metadata",
                  absl::StrCat("block: claims ", size, " bytes (1 to ", Metadata::kMaxSize,
                               ", within the body's ", body.size() - MetadataBlock::kPrefix, ")"));
  }
  layout->metadata = body.subspan(MetadataBlock::kPrefix, size);
  body = body.subspan(MetadataBlock::kPrefix + size);
  // DecodeRpcHeader checked the large body's trailer against the whole body, block included.
  if (header.large_body() && body.size() < LargeBody::kSize) {
    return Refuse("body",
                  absl::StrCat("has ", body.size(), " bytes after its metadata, too few for the ",
                               LargeBody::kSize, "-byte large-body trailer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MessageLayout> DecodeLayout(const RpcHeader& header,
                                           absl::Span<const uint8_t> message) {
  MessageLayout layout;
  absl::Span<const uint8_t> body = message.subspan(RpcHeader::kSize);
  if (ABSL_PREDICT_FALSE((header.flags & kRpcFlagMetadata) != 0)) {
    if (absl::Status split = SplitMetadata(header, &body, &layout); !split.ok()) return split;
  }
  size_t trailer = 0;  // bytes after the inline body
  if (header.large_body()) {
    const uint8_t* in = body.data();  // DecodeRpcHeader checked the trailer is there
    layout.payload_body = transport::GetLe<uint32_t>(in);
    if (transport::GetLe<uint32_t>(in + 4) != 0) {
      return Refuse("large body", "has its reserved bytes set");
    }
    if (layout.payload_body == 0 || layout.payload_body > header.bulk_size) {
      return Refuse("large body", absl::StrCat("claims ", layout.payload_body, " bytes of a ",
                                               header.bulk_size, "-byte payload"));
    }
    trailer = LargeBody::kSize;
  }
  if (header.pulls()) {
    // One range for the payload, or two when a large body and a bulk payload lie apart.
    layout.pull_count = header.large_body() && layout.payload_body < header.bulk_size ? 2 : 1;
    trailer += PullDescriptor::kSize * layout.pull_count;
  }
  if (body.size() < trailer || (header.large_body() && body.size() != trailer)) {
    return Refuse("body", absl::StrCat("has ", body.size(), " bytes; its flags call for ",
                                       header.large_body() ? "exactly " : "at least ", trailer));
  }
  const size_t descriptors = body.size() - PullDescriptor::kSize * layout.pull_count;
  for (int i = 0; i < layout.pull_count; ++i) {
    absl::StatusOr<PullDescriptor> d = DecodePullDescriptor(
        body.subspan(descriptors + PullDescriptor::kSize * i, PullDescriptor::kSize));
    if (!d.ok()) return d.status();
    if (i > 0 && d->flags != layout.pulls[0].flags) {
      return Refuse("pull descriptors", "differ in their flags");
    }
    layout.pulls[i] = *d;
  }
  if (layout.pull_count > 0 && (layout.pulls[0].flags & kPullWindow) != 0) {
    layout.invalidate_rkey = layout.pulls[0].rkey;
  }
  if (!header.large_body()) layout.body = body.subspan(0, body.size() - trailer);
  return layout;
}

void EncodeRpcHeader(const RpcHeader& h, uint8_t* out) {
  out[kKindAt] = static_cast<uint8_t>(h.kind);
  out[kFlagsAt] = h.flags;
  transport::PutLe<uint16_t>(out + kMethodAt, h.method_index);
  transport::PutLe<uint32_t>(out + kServiceAt, h.service_id);
  transport::PutLe<uint64_t>(out + kCallIdAt, h.call_id);
  transport::PutLe<uint64_t>(out + kTimeoutAt, h.timeout_us);
  transport::PutLe<uint32_t>(out + kBulkSizeAt, h.bulk_size);
  transport::PutLe<uint16_t>(out + kStatusAt, static_cast<uint16_t>(h.status_code));
  transport::PutLe<uint16_t>(out + kWindowAt, h.window);
}

absl::StatusOr<RpcHeader> DecodeRpcHeader(absl::Span<const uint8_t> message) {
  if (message.size() < RpcHeader::kSize) {
    return Refuse("length", absl::StrCat("is ", message.size(), " bytes, shorter than the ",
                                         RpcHeader::kSize, "-byte header"));
  }
  const uint8_t* in = message.data();
  const size_t body = message.size() - RpcHeader::kSize;
  const uint8_t kind = in[kKindAt];
  if (kind < static_cast<uint8_t>(RpcKind::kRequest) ||
      kind > static_cast<uint8_t>(RpcKind::kStreamCredit)) {
    return Refuse("kind", absl::StrCat(static_cast<int>(kind), " is unknown"));
  }
  RpcHeader h;
  h.kind = static_cast<RpcKind>(kind);
  h.flags = in[kFlagsAt];
  h.method_index = transport::GetLe<uint16_t>(in + kMethodAt);
  h.service_id = transport::GetLe<uint32_t>(in + kServiceAt);
  h.call_id = transport::GetLe<uint64_t>(in + kCallIdAt);
  h.timeout_us = transport::GetLe<uint64_t>(in + kTimeoutAt);
  h.bulk_size = transport::GetLe<uint32_t>(in + kBulkSizeAt);
  const uint16_t status = transport::GetLe<uint16_t>(in + kStatusAt);
  h.window = transport::GetLe<uint16_t>(in + kWindowAt);

  if ((h.flags & ~(kRpcFlagBulk | kRpcFlagPull | kRpcFlagPullResponse | kRpcFlagLargeBody |
                   kRpcFlagStream | kRpcFlagMetadata)) != 0) {
    return Refuse("flags", absl::StrCat("0x", absl::Hex(h.flags), " has unknown bits set"));
  }
  // Only stream opens and credits grant messages, and they grant at least one.
  const bool grants =
      (h.kind == RpcKind::kRequest && h.opens_stream()) || h.kind == RpcKind::kStreamCredit;
  if (grants && h.window == 0) return Refuse("window", "is 0 where it grants messages");
  if (!grants && h.window != 0) {
    return Refuse("window", absl::StrCat("is ", h.window, " in a ", KindName(h.kind),
                                         h.kind == RpcKind::kRequest ? " that opens no stream" : "",
                                         " (must be 0)"));
  }
  if (h.call_id == 0) return Refuse("call_id", "is 0, which no call has");
  if (status > kMaxStatusCode) {
    return Refuse("status_code", absl::StrCat(status, " is not an absl::StatusCode"));
  }
  h.status_code = static_cast<absl::StatusCode>(status);

  // Only requests address a service and carry a deadline (and a pulled word, an address in the
  // deadline's place).
  if (h.kind != RpcKind::kRequest) {
    if (h.service_id != 0) return NotZero("service_id", h.service_id, h.kind);
    if (h.method_index != 0) return NotZero("method_index", h.method_index, h.kind);
    if (h.timeout_us != 0 && h.kind != RpcKind::kPulled) {
      return NotZero("timeout_us", h.timeout_us, h.kind);
    }
  }
  // Only requests, responses and stream messages carry bulk payloads and bodies of the caller's
  // choosing.
  if (h.kind == RpcKind::kRequest || h.kind == RpcKind::kResponse ||
      h.kind == RpcKind::kStreamMessage) {
    if (h.has_bulk() && h.bulk_size == 0) return Refuse("bulk_size", "is 0 with the bulk flag set");
    if (!h.has_bulk() && h.bulk_size != 0) {
      return Refuse("bulk_size", absl::StrCat("is ", h.bulk_size, " without the bulk flag"));
    }
    if (h.pulls() && !h.has_bulk()) return Refuse("flags", "ask to pull without the bulk flag");
    if (h.large_body() && !h.has_bulk()) {
      return Refuse("flags", "put the body in a payload without the bulk flag");
    }
    if (h.large_body() && body < LargeBody::kSize) {
      return Refuse("body", absl::StrCat("has ", body, " bytes, too few for the ", LargeBody::kSize,
                                         "-byte large-body trailer"));
    }
    if (h.kind != RpcKind::kRequest && (h.flags & kRpcFlagPullResponse) != 0) {
      return Refuse("flags", "ask for a pulled response outside a request");
    }
    if (h.kind != RpcKind::kRequest && h.opens_stream()) {
      return Refuse("flags", "open a stream outside a request");
    }
    if (h.pulls() && body < PullDescriptor::kSize) {
      return Refuse("body", absl::StrCat("has ", body, " bytes, too few for the ",
                                         PullDescriptor::kSize, "-byte pull descriptor"));
    }
    if (h.kind == RpcKind::kStreamMessage && (h.flags & kRpcFlagMetadata) != 0) {
      return Refuse("flags", "carry metadata on a stream message");
    }
  } else {
    // An error may carry metadata (trailing metadata, status payloads), nothing else.
    const uint8_t allowed = h.kind == RpcKind::kError ? kRpcFlagMetadata : 0;
    if ((h.flags & ~allowed) != 0) return NotZero("flags", h.flags, h.kind);
    if (h.bulk_size != 0) return NotZero("bulk_size", h.bulk_size, h.kind);
  }
  // Only errors carry a status, and it is never OK.
  if (h.kind == RpcKind::kError) {
    if (h.status_code == absl::StatusCode::kOk) return Refuse("status_code", "is OK in an error");
    // The message itself is checked against kMaxErrorMessage once the metadata block is off.
    const size_t block =
        (h.flags & kRpcFlagMetadata) != 0 ? MetadataBlock::kPrefix + Metadata::kMaxSize : 0;
    if (body > kMaxErrorMessage + block) {
      return Refuse("body", absl::StrCat("of an error has ", body, " bytes, more than ",
                                         kMaxErrorMessage + block));
    }
  } else if (status != 0) {
    return NotZero("status_code", status, h.kind);
  }
  if ((h.kind == RpcKind::kCancel || h.kind == RpcKind::kPulled || h.kind == RpcKind::kHalfClose ||
       h.kind == RpcKind::kStreamCredit) &&
      body != 0) {
    return Refuse("body",
                  absl::StrCat("of a ", KindName(h.kind), " has ", body, " bytes (must be empty)"));
  }
  return h;
}

size_t ErrorBodySize(absl::string_view message, size_t limit) {
  const Cut cut = CutErrorMessage(message, limit);
  return cut.keep + cut.marker;
}

size_t EncodeErrorBody(absl::string_view message, uint8_t* out, size_t limit) {
  const Cut cut = CutErrorMessage(message, limit);
  if (cut.keep > 0) std::memcpy(out, message.data(), cut.keep);
  if (cut.marker > 0) std::memcpy(out + cut.keep, kTruncatedMarker.data(), cut.marker);
  return cut.keep + cut.marker;
}

absl::Status DecodeErrorBody(const RpcHeader& header, absl::Span<const uint8_t> body,
                             absl::Status* peer) {
  if (header.kind != RpcKind::kError || header.status_code == absl::StatusCode::kOk) {
    return Refuse("kind", "is not an error with a status code");
  }
  if (body.size() > kMaxErrorMessage) {
    return Refuse("body", absl::StrCat("of an error has ", body.size(), " bytes, more than ",
                                       kMaxErrorMessage));
  }
  *peer = absl::Status(header.status_code,
                       absl::string_view(reinterpret_cast<const char*>(body.data()), body.size()));
  return absl::OkStatus();
}

namespace {

bool TypeUrlOk(absl::string_view url) {
  if (url.empty() || url.size() > Metadata::kMaxKey) return false;
  for (char c : url) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

size_t EntrySize(absl::string_view key, size_t value) {
  return Metadata::kEntryOverhead + key.size() + value;
}

// Writes an entry's header and key; its `value_size` bytes of value follow at `out`.
void PutEntryHead(uint8_t type, absl::string_view key, size_t value_size, uint8_t*& out) {
  out[0] = type;
  out[1] = static_cast<uint8_t>(key.size());
  transport::PutLe<uint16_t>(out + 2, static_cast<uint16_t>(value_size));
  out += Metadata::kEntryOverhead;
  std::memcpy(out, key.data(), key.size());
  out += key.size();
}

void PutBytes(absl::string_view bytes, uint8_t*& out) {
  if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  out += bytes.size();
}

// Calls `fn(type_url, bytes)` for each of `status`'s payloads that fits beside `used` bytes of
// entries, in the order ForEachPayload gives them, and says whether one did not.
template <typename Fn>
bool ForEachFittingPayload(const absl::Status* status, size_t used, Fn fn) {
  bool dropped = false;
  if (status == nullptr || status->ok()) return false;
  status->ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    const size_t size = EntrySize(url, payload.size());
    if (!TypeUrlOk(url) || used + size > Metadata::kMaxSize) {
      dropped = true;
      return;
    }
    used += size;
    fn(url, payload);
  });
  return dropped;
}

}  // namespace

size_t MetadataBlockSize(const Metadata* metadata, const absl::Status* status,
                         bool* payloads_dropped) {
  size_t used = metadata != nullptr ? metadata->encoded_size() : 0;
  const bool dropped =
      ForEachFittingPayload(status, used, [&](absl::string_view url, const absl::Cord& payload) {
        used += EntrySize(url, payload.size());
      });
  if (payloads_dropped != nullptr) *payloads_dropped = dropped;
  return used == 0 ? 0 : MetadataBlock::kPrefix + used;
}

void EncodeMetadataBlock(const Metadata* metadata, const absl::Status* status, uint8_t* out) {
  uint8_t* const start = out;
  out += MetadataBlock::kPrefix;
  if (metadata != nullptr) {
    for (const Metadata::Entry& entry : metadata->entries()) {
      PutEntryHead(MetadataBlock::kEntry, entry.key, entry.value.size(), out);
      PutBytes(entry.value, out);
    }
  }
  const size_t used = static_cast<size_t>(out - start) - MetadataBlock::kPrefix;
  ForEachFittingPayload(status, used, [&](absl::string_view url, const absl::Cord& payload) {
    PutEntryHead(MetadataBlock::kStatusPayload, url, payload.size(), out);
    for (absl::string_view chunk : payload.Chunks()) PutBytes(chunk, out);  // no flat copy
  });
  transport::PutLe<uint32_t>(start, static_cast<uint32_t>(out - start - MetadataBlock::kPrefix));
}

absl::Status DecodeMetadataBlock(absl::Span<const uint8_t> entries, Metadata* metadata,
                                 absl::Status* status) {
  size_t at = 0;
  for (int index = 0; at < entries.size(); ++index) {
    if (entries.size() - at < Metadata::kEntryOverhead) {
      return Refuse("metadata", absl::StrCat("entry ", index, " is cut short"));
    }
    const uint8_t type = entries[at];
    const size_t key_size = entries[at + 1];
    const size_t value_size = transport::GetLe<uint16_t>(entries.data() + at + 2);
    at += Metadata::kEntryOverhead;
    if (entries.size() - at < key_size + value_size) {
      return Refuse("metadata",
                    absl::StrCat("entry ", index, " claims ", key_size + value_size,
                                 " bytes of the block's ", entries.size() - at, " left"));
    }
    const absl::string_view key(reinterpret_cast<const char*>(entries.data() + at), key_size);
    const absl::string_view value(reinterpret_cast<const char*>(entries.data() + at + key_size),
                                  value_size);
    at += key_size + value_size;
    if (type == MetadataBlock::kEntry) {
      absl::Status valid = Metadata::CheckKey(key);
      if (valid.ok()) valid = Metadata::CheckValue(key, value);
      if (!valid.ok()) {
        return Refuse("metadata", absl::StrCat("entry ", index, ": ", valid.message()));
      }
      metadata->AddUnchecked(key, value);
    } else if (type == MetadataBlock::kStatusPayload) {
      if (status == nullptr || status->ok()) {
        return Refuse("metadata", absl::StrCat("entry ", index,
                                               " is a status payload outside "
                                               "an error"));
      }
      if (!TypeUrlOk(key)) {
        return Refuse("metadata", absl::StrCat("entry ", index,
                                               ": a status payload's type URL "
                                               "is not printable ASCII"));
      }
      status->SetPayload(key, absl::Cord(value));
    } else {
      return Refuse("metadata", absl::StrCat("entry ", index, " has type ", static_cast<int>(type),
                                             " (0 and 1 are defined)"));
    }
  }
  return absl::OkStatus();
}

uint64_t TimeoutToWireNanos(int64_t deadline_nanos, int64_t now_nanos) {
  if (deadline_nanos <= now_nanos) return 1;
  // Positive, and below 2^64 whatever the two are: exact in unsigned arithmetic.
  const uint64_t remaining =
      static_cast<uint64_t>(deadline_nanos) - static_cast<uint64_t>(now_nanos);
  return remaining / 1000 + (remaining % 1000 != 0 ? 1 : 0);  // rounded up: at least 1
}

transport::AcceptData EncodeAcceptData(uint32_t idle_interval_ms) {
  transport::AcceptData data{};
  transport::PutLe<uint32_t>(data.data(), idle_interval_ms);
  return data;
}

uint32_t AcceptDataIdleIntervalMs(const transport::AcceptData& data) {
  return transport::GetLe<uint32_t>(data.data());
}

int64_t DeadlineNanosFromWire(uint64_t timeout_us, int64_t now_nanos) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  if (timeout_us == 0 || timeout_us > static_cast<uint64_t>(kNone / 1000)) return kNone;
  const int64_t remaining = static_cast<int64_t>(timeout_us) * 1000;
  return now_nanos > kNone - remaining ? kNone : now_nanos + remaining;
}

}  // namespace zrpc
