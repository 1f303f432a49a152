// Peer authentication by a pre-shared key: the keys, the handshake's bytes and its tags.
//
// Who may connect. Without keys, anyone who reaches a listener's port may connect and call,
// within the admission limits (listener.h). With keys, both sides prove they hold the same secret
// before the server runs anything for the client or exposes a memory key to it. A key is a secret
// of 16 to 64 bytes named by a nonzero 32-bit id, so that keys can rotate: a server accepts every
// key of its keyring (the old and the new while a rotation lasts), a client presents one.
//
// The exchange. The secret never travels; fresh nonces make every handshake's transcript new:
//   1. the connect request carries the client's Hello and, in the 20 bytes the Hello leaves spare
//      (wire.h), an AuthRequest: the key's id and the client's nonce;
//   2. the accept reply carries the server's Hello, the accept data and, in place of a park door,
//      an AuthReply: the server's nonce and its tag. The client checks the tag before it sends
//      anything, so a server that does not hold the key learns nothing from it;
//   3. the client's first frame carries the client's tag. Until the server has checked it, the
//      server grants the client a single receive (for that frame) and tells it no memory key.
// Each tag is HMAC-SHA256 (OpenSSL's libcrypto), keyed by the secret, over the transcript
// (AuthTranscript): a label naming whose tag it is, so that a tag reflected back is not the
// other side's, then the key id, both nonces, both QP numbers and both Hellos as sent.
//
// Replays. A recorded request replayed to the server meets a new server nonce, so the client tag
// recorded with it fails; the server also remembers the client nonces it saw last (NonceCache)
// and refuses a request that repeats one at once, with that reason. A recorded accept reply
// replayed to a client fails against the client's new nonce.
//
// What this does not do: encrypt or authenticate the traffic after the handshake. On RoCE without
// IPsec or MACsec, an attacker on the path (or root on either host) who learns a QP's numbers and
// packet sequence can still inject into it; memory windows bound to the QP (memory_window.h) keep
// such a packet to what that QP may reach.
//
// Where it runs: the listener checks the request and answers (listener.cc), Connection::Connect
// checks the reply and sends the kAuth frame, the server's connection checks that frame on its
// poller and answers kAuthOk, and only then does AcceptHandler::OnAccepted see the connection
// (or Connect return it). A connection waiting for the peer's tag is in the state kVerifying:
// not open to the layer above, and its failure is the handshake's (AuthSession), never a
// handler's OnClosed.
//
// Thread-safety: AuthKeyring is immutable once made (share it); NonceCache is not thread-safe
// (the listener's thread owns one).
#ifndef ZRPC_TRANSPORT_AUTH_H_
#define ZRPC_TRANSPORT_AUTH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "transport/options.h"
#include "transport/wire.h"

namespace zrpc::transport {

inline constexpr size_t kAuthNonceSize = 16;
inline constexpr size_t kAuthTagSize = 32;  // HMAC-SHA256
inline constexpr size_t kMinAuthSecret = 16;
inline constexpr size_t kMaxAuthSecret = 64;  // SHA-256's block: a longer key is hashed first
using AuthNonce = std::array<uint8_t, kAuthNonceSize>;
using AuthTag = std::array<uint8_t, kAuthTagSize>;

// The keys one side holds, checked once: ids nonzero and distinct, secrets of kMinAuthSecret to
// kMaxAuthSecret bytes. A client presents its first key; a server accepts any of them.
class AuthKeyring {
 public:
  // InvalidArgument, naming the key at fault by its id (never its secret), for an empty list, an
  // id of 0, an id given twice, or a secret of the wrong length.
  static absl::StatusOr<AuthKeyring> Create(std::vector<AuthKey> keys);

  // The key named `id`, or null.
  const AuthKey* Find(uint32_t id) const;
  // The key a client presents.
  const AuthKey& first() const { return keys_.front(); }
  const std::vector<AuthKey>& keys() const { return keys_; }

 private:
  explicit AuthKeyring(std::vector<AuthKey> keys) : keys_(std::move(keys)) {}
  std::vector<AuthKey> keys_;
};

// In the connect request after the Hello: the 20 bytes it leaves (wire.h).
//   offset size field
//    0     4    key_id   little-endian; 0: the client presents no key (an older or keyless
//                        client: the CM pads the request with zeros)
//    4    16    nonce    the client's, random
struct AuthRequest {
  uint32_t key_id = 0;
  AuthNonce nonce{};

  static constexpr size_t kSize = 4 + kAuthNonceSize;
  static constexpr size_t kOffset = Hello::kSize;  // in the connect request
  bool operator==(const AuthRequest& other) const {
    return key_id == other.key_id && nonce == other.nonce;
  }
};
static_assert(AuthRequest::kOffset + AuthRequest::kSize <= kMaxConnectPrivateData,
              "the request carries at most 56 bytes");
void EncodeAuthRequest(const AuthRequest& request, uint8_t* out);
// What the request carried after its Hello: key_id 0 (none) when it carried nothing there.
// FailedPrecondition when a key id is given with fewer than kSize bytes, or with a nonce of zeros
// (no client draws one: it says the bytes were cut short or forged).
absl::StatusOr<AuthRequest> DecodeAuthRequest(absl::Span<const uint8_t> bytes);

// The client's first frame (kAuth, wire.h) on a connection that authenticates, its payload:
//   offset size field
//    0    32    tag         the client's tag over the transcript
//   32     8    arena_addr  the client's receive arena (0 when it has none or lends it on demand)
//   40     4    arena_rkey  its key
struct AuthFrame {
  AuthTag tag{};
  uint64_t arena_addr = 0;
  uint32_t arena_rkey = 0;

  static constexpr size_t kSize = kAuthTagSize + 12;
  static_assert(kSize == kAuthFramePayload, "wire.h's frame check");
  bool operator==(const AuthFrame& other) const {
    return tag == other.tag && arena_addr == other.arena_addr && arena_rkey == other.arena_rkey;
  }
};
void EncodeAuthFrame(const AuthFrame& frame, uint8_t* out);
// FailedPrecondition unless `payload` is kSize bytes.
absl::StatusOr<AuthFrame> DecodeAuthFrame(absl::Span<const uint8_t> payload);

// The server's first frame (kAuthOk) once it has checked the client's tag, its payload:
//   offset size field
//    0     8    arena_addr  the server's receive arena (0 when it has none or lends it on demand)
//    8     4    arena_rkey  its key
//   12    16    door        a ParkDoor (wire.h) when the server's Hello says kHelloParks, else
//                           zeros
// Its header returns the client's whole window: the credit the kAuth spent and the rest the
// Hello held back.
struct AuthOkFrame {
  uint64_t arena_addr = 0;
  uint32_t arena_rkey = 0;
  ParkDoor door{};

  static constexpr size_t kSize = 12 + ParkDoor::kSize;
  static_assert(kSize == kAuthOkFramePayload, "wire.h's frame check");
  bool operator==(const AuthOkFrame& other) const {
    return arena_addr == other.arena_addr && arena_rkey == other.arena_rkey && door == other.door;
  }
};
void EncodeAuthOkFrame(const AuthOkFrame& frame, uint8_t* out);
// FailedPrecondition unless `payload` is kSize bytes and, when `parks`, its door is one
// (DecodeParkDoor), or else zeros.
absl::StatusOr<AuthOkFrame> DecodeAuthOkFrame(absl::Span<const uint8_t> payload, bool parks);

// Whether an arena's address and key from a kAuth or kAuthOk frame fit the Hello of the peer that
// sent them: none (zeros) for a peer without an arena or lending it on demand, and an arena that
// does not wrap around the address space otherwise. FailedPrecondition, saying which.
absl::Status CheckAuthArena(const Hello& peer, uint64_t addr, uint32_t rkey);

// In the accept reply after the accept data, where a park door would be (the door waits until the
// client is verified):
//   offset size field
//    0    16    nonce    the server's, random
//   16    32    tag      the server's tag over the transcript
struct AuthReply {
  AuthNonce nonce{};
  AuthTag tag{};

  static constexpr size_t kSize = kAuthNonceSize + kAuthTagSize;
  static constexpr size_t kOffset = Hello::kSize + kAcceptDataSize;  // in the accept reply
  bool operator==(const AuthReply& other) const { return nonce == other.nonce && tag == other.tag; }
};
void EncodeAuthReply(const AuthReply& reply, uint8_t* out);
// FailedPrecondition when fewer than kSize bytes came, or the nonce is all zeros (a server that
// authenticates always sends one; zeros are what a reply without one reads as).
absl::StatusOr<AuthReply> DecodeAuthReply(absl::Span<const uint8_t> bytes);

// What both tags cover. The Hellos are the bytes as sent (Hello::kSize each), so that a field a
// later version adds is covered without a change here.
struct AuthTranscript {
  uint32_t key_id = 0;
  AuthNonce client_nonce{};
  AuthNonce server_nonce{};
  uint32_t client_qp = 0;
  uint32_t server_qp = 0;
  std::array<uint8_t, Hello::kSize> client_hello{};
  std::array<uint8_t, Hello::kSize> server_hello{};
};

enum class AuthRole { kServer, kClient };

// HMAC-SHA256 keyed by `key.secret` over, in order: the label "zrpc auth v1 server" or "zrpc auth
// v1 client" (19 bytes, no terminator), key_id (4, little-endian), client_nonce, server_nonce,
// client_qp, server_qp (4 each, little-endian), client_hello, server_hello: 135 bytes. Internal
// when libcrypto fails (it does not for these sizes).
absl::StatusOr<AuthTag> ComputeAuthTag(AuthRole role, const AuthKey& key,
                                       const AuthTranscript& transcript);
// Whether `got` is `expected`, in time that does not depend on where they differ.
bool AuthTagMatches(const AuthTag& expected, const AuthTag& got);
// A nonce from libcrypto's generator (seeded by the kernel): Internal when it has no entropy,
// rather than a value a peer could guess.
absl::StatusOr<AuthNonce> NewAuthNonce();

// The client nonces a server saw last, per key id: a request that repeats one is a replay. Holds
// the last `capacity` (a ring and a set: bounded memory whatever peers send); one older than
// that falls out, and its replay then fails on its tag instead.
class NonceCache {
 public:
  explicit NonceCache(size_t capacity) : capacity_(capacity) {}
  // False when (key_id, nonce) is among the last `capacity` seen; else remembers it.
  bool Insert(uint32_t key_id, const AuthNonce& nonce);
  size_t size() const { return order_.size(); }

 private:
  using Entry = std::array<uint8_t, 4 + kAuthNonceSize>;
  const size_t capacity_;
  std::deque<Entry> order_;
  absl::flat_hash_set<Entry> seen_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_AUTH_H_
