#include "transport/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "transport/byte_order.h"

namespace zrpc::transport {
namespace {

constexpr absl::string_view kServerLabel = "zrpc auth v1 server";
constexpr absl::string_view kClientLabel = "zrpc auth v1 client";
static_assert(kServerLabel.size() == kClientLabel.size());
constexpr size_t kTranscriptSize =
    kServerLabel.size() + 4 + 2 * kAuthNonceSize + 4 + 4 + 2 * Hello::kSize;

bool AllZero(absl::Span<const uint8_t> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

}  // namespace

absl::StatusOr<AuthKeyring> AuthKeyring::Create(std::vector<AuthKey> keys) {
  if (keys.empty()) return absl::InvalidArgumentError("an authentication keyring needs a key");
  for (size_t i = 0; i < keys.size(); ++i) {
    const AuthKey& key = keys[i];
    if (key.id == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("authentication key ", i + 1, " of ", keys.size(),
                       " has id 0, which means \"no key\" on the wire: give it a nonzero id"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (keys[j].id == key.id) {
        return absl::InvalidArgumentError(
            absl::StrCat("authentication key id ", key.id, " is given twice"));
      }
    }
    if (key.secret.size() < kMinAuthSecret || key.secret.size() > kMaxAuthSecret) {
      return absl::InvalidArgumentError(
          absl::StrCat("authentication key ", key.id, ": its secret is ", key.secret.size(),
                       " bytes; it must be ", kMinAuthSecret, " to ", kMaxAuthSecret));
    }
  }
  return AuthKeyring(std::move(keys));
}

const AuthKey* AuthKeyring::Find(uint32_t id) const {
  if (id == 0) return nullptr;
  for (const AuthKey& key : keys_) {
    if (key.id == id) return &key;
  }
  return nullptr;
}

void EncodeAuthRequest(const AuthRequest& request, uint8_t* out) {
  PutLe<uint32_t>(out, request.key_id);
  std::copy(request.nonce.begin(), request.nonce.end(), out + 4);
}

absl::StatusOr<AuthRequest> DecodeAuthRequest(absl::Span<const uint8_t> bytes) {
  AuthRequest request;
  if (bytes.size() < 4) {
    if (!AllZero(bytes)) {
      return absl::FailedPreconditionError("zrpc handshake: the request's key id is cut short");
    }
    return request;  // nothing there: no key
  }
  request.key_id = GetLe<uint32_t>(bytes.data());
  if (request.key_id == 0) return request;
  if (bytes.size() < AuthRequest::kSize) {
    return absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: the request names key ", request.key_id, " but carries ",
                     bytes.size() - 4, " of the nonce's ", kAuthNonceSize, " bytes"));
  }
  std::copy(bytes.begin() + 4, bytes.begin() + AuthRequest::kSize, request.nonce.begin());
  if (AllZero(request.nonce)) {
    return absl::FailedPreconditionError(
        absl::StrCat("zrpc handshake: the request names key ", request.key_id,
                     " with a nonce of zeros, which no client draws"));
  }
  return request;
}

void EncodeAuthFrame(const AuthFrame& frame, uint8_t* out) {
  std::copy(frame.tag.begin(), frame.tag.end(), out);
  PutLe<uint64_t>(out + kAuthTagSize, frame.arena_addr);
  PutLe<uint32_t>(out + kAuthTagSize + 8, frame.arena_rkey);
}

absl::StatusOr<AuthFrame> DecodeAuthFrame(absl::Span<const uint8_t> payload) {
  if (payload.size() != AuthFrame::kSize) {
    return absl::FailedPreconditionError(absl::StrCat("peer sent an auth frame of ", payload.size(),
                                                      " bytes, not ", AuthFrame::kSize));
  }
  AuthFrame frame;
  std::copy(payload.begin(), payload.begin() + kAuthTagSize, frame.tag.begin());
  frame.arena_addr = GetLe<uint64_t>(payload.data() + kAuthTagSize);
  frame.arena_rkey = GetLe<uint32_t>(payload.data() + kAuthTagSize + 8);
  return frame;
}

void EncodeAuthOkFrame(const AuthOkFrame& frame, uint8_t* out) {
  PutLe<uint64_t>(out, frame.arena_addr);
  PutLe<uint32_t>(out + 8, frame.arena_rkey);
  EncodeParkDoor(frame.door, out + 12);
}

absl::StatusOr<AuthOkFrame> DecodeAuthOkFrame(absl::Span<const uint8_t> payload, bool parks) {
  if (payload.size() != AuthOkFrame::kSize) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer sent an auth-ok frame of ", payload.size(), " bytes, not ", AuthOkFrame::kSize));
  }
  AuthOkFrame frame;
  frame.arena_addr = GetLe<uint64_t>(payload.data());
  frame.arena_rkey = GetLe<uint32_t>(payload.data() + 8);
  const absl::Span<const uint8_t> door = payload.subspan(12);
  if (parks) {
    absl::StatusOr<ParkDoor> decoded = DecodeParkDoor(door);
    if (!decoded.ok()) return decoded.status();
    frame.door = *decoded;
  } else if (!AllZero(door)) {
    return absl::FailedPreconditionError(
        "peer's auth-ok frame gives a park door, but its Hello did not say it parks");
  }
  return frame;
}

absl::Status CheckAuthArena(const Hello& peer, uint64_t addr, uint32_t rkey) {
  const bool fixed = peer.arena_size > 0 && (peer.flags & kHelloArenaOnDemand) == 0;
  if (!fixed) {
    if (addr != 0 || rkey != 0) {
      return absl::FailedPreconditionError(
          "peer's first frame gives an arena address or key, but its Hello has no arena of its "
          "own to give (none, or lent on demand)");
    }
    return absl::OkStatus();
  }
  if (addr + peer.arena_size < addr) {
    return absl::FailedPreconditionError("peer's arena wraps around the address space");
  }
  return absl::OkStatus();
}

void EncodeAuthReply(const AuthReply& reply, uint8_t* out) {
  std::copy(reply.nonce.begin(), reply.nonce.end(), out);
  std::copy(reply.tag.begin(), reply.tag.end(), out + kAuthNonceSize);
}

absl::StatusOr<AuthReply> DecodeAuthReply(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < AuthReply::kSize) {
    return absl::FailedPreconditionError(absl::StrCat("zrpc handshake: the server's reply carries ",
                                                      bytes.size(), " of the ", AuthReply::kSize,
                                                      " bytes of its authentication"));
  }
  AuthReply reply;
  std::copy(bytes.begin(), bytes.begin() + kAuthNonceSize, reply.nonce.begin());
  std::copy(bytes.begin() + kAuthNonceSize, bytes.begin() + AuthReply::kSize, reply.tag.begin());
  if (AllZero(reply.nonce)) {
    return absl::FailedPreconditionError(
        "zrpc handshake: the server did not authenticate itself (no nonce in its reply): it "
        "holds no key, or is not the server meant");
  }
  return reply;
}

absl::StatusOr<AuthTag> ComputeAuthTag(AuthRole role, const AuthKey& key,
                                       const AuthTranscript& transcript) {
  std::array<uint8_t, kTranscriptSize> bytes;
  uint8_t* p = bytes.data();
  const absl::string_view label = role == AuthRole::kServer ? kServerLabel : kClientLabel;
  p = std::copy(label.begin(), label.end(), p);
  PutLe<uint32_t>(p, transcript.key_id);
  p += 4;
  p = std::copy(transcript.client_nonce.begin(), transcript.client_nonce.end(), p);
  p = std::copy(transcript.server_nonce.begin(), transcript.server_nonce.end(), p);
  PutLe<uint32_t>(p, transcript.client_qp);
  p += 4;
  PutLe<uint32_t>(p, transcript.server_qp);
  p += 4;
  p = std::copy(transcript.client_hello.begin(), transcript.client_hello.end(), p);
  p = std::copy(transcript.server_hello.begin(), transcript.server_hello.end(), p);
  AuthTag tag;
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()), bytes.data(),
           bytes.size(), tag.data(), &length) == nullptr ||
      length != tag.size()) {
    return absl::InternalError("libcrypto's HMAC-SHA256 failed");
  }
  return tag;
}

bool AuthTagMatches(const AuthTag& expected, const AuthTag& got) {
  return CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

absl::StatusOr<AuthNonce> NewAuthNonce() {
  AuthNonce nonce;
  // A nonce of zeros means "none" on the wire: drawn again (one chance in 2^128).
  do {
    if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
      return absl::InternalError("libcrypto's random generator has no entropy for a nonce");
    }
  } while (AllZero(nonce));
  return nonce;
}

bool NonceCache::Insert(uint32_t key_id, const AuthNonce& nonce) {
  Entry entry;
  PutLe<uint32_t>(entry.data(), key_id);
  std::copy(nonce.begin(), nonce.end(), entry.begin() + 4);
  if (!seen_.insert(entry).second) return false;
  order_.push_back(entry);
  if (order_.size() > capacity_) {
    seen_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

}  // namespace zrpc::transport
