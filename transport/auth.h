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
// Status: this file holds the keys, the bytes and the tags, tested on their own
// (tests/transport/auth_test). The handshake does not carry them yet: the listener and
// Connection::Connect take them up with the next wire version, and until then no connection is
// authenticated (docs/guide.md, "Not there yet").
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
#include "transport/wire.h"

namespace zrpc::transport {

inline constexpr size_t kAuthNonceSize = 16;
inline constexpr size_t kAuthTagSize = 32;  // HMAC-SHA256
inline constexpr size_t kMinAuthSecret = 16;
inline constexpr size_t kMaxAuthSecret = 64;  // SHA-256's block: a longer key is hashed first
using AuthNonce = std::array<uint8_t, kAuthNonceSize>;
using AuthTag = std::array<uint8_t, kAuthTagSize>;

// A pre-shared key: `id` names it on the wire (nonzero: 0 means "no key"), `secret` is never sent.
struct AuthKey {
  uint32_t id = 0;
  std::string secret;
};

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
