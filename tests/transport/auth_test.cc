// transport/auth.h on the host: keyrings, the handshake's bytes, tags, the replay cache, and a
// session's outcome (auth_session.h).
#include "transport/auth.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <thread>

#include "transport/auth_session.h"

namespace zrpc::transport {
namespace {

std::string Hex(const AuthTag& tag) {
  std::string out;
  char byte[3];
  for (uint8_t b : tag) {
    std::snprintf(byte, sizeof(byte), "%02x", b);
    out += byte;
  }
  return out;
}

AuthTranscript SampleTranscript() {
  AuthTranscript t;
  t.key_id = 0x01020304;
  for (size_t i = 0; i < kAuthNonceSize; ++i) {
    t.client_nonce[i] = static_cast<uint8_t>(1 + i);
    t.server_nonce[i] = static_cast<uint8_t>(101 + i);
  }
  t.client_qp = 0x11;
  t.server_qp = 0x2233;
  for (size_t i = 0; i < Hello::kSize; ++i) {
    t.client_hello[i] = static_cast<uint8_t>(i * 3);
    t.server_hello[i] = static_cast<uint8_t>(i * 7 + 1);
  }
  return t;
}

const AuthKey kKey{0x01020304, "0123456789abcdef0123456789abcdef"};

TEST_CASE("a keyring refuses what cannot work, naming the key by its id") {
  CHECK(AuthKeyring::Create({}).status().code() == absl::StatusCode::kInvalidArgument);
  auto zero = AuthKeyring::Create({{0, std::string(16, 'k')}});
  REQUIRE_FALSE(zero.ok());
  CHECK_THAT(std::string(zero.status().message()), Catch::Contains("id 0"));
  auto twice = AuthKeyring::Create({{7, std::string(16, 'a')}, {7, std::string(16, 'b')}});
  REQUIRE_FALSE(twice.ok());
  CHECK_THAT(std::string(twice.status().message()), Catch::Contains("7 is given twice"));
  // At and one past each limit of the secret's length.
  CHECK(AuthKeyring::Create({{1, std::string(kMinAuthSecret, 's')}}).ok());
  CHECK(AuthKeyring::Create({{1, std::string(kMaxAuthSecret, 's')}}).ok());
  auto short_secret = AuthKeyring::Create({{9, std::string(kMinAuthSecret - 1, 's')}});
  REQUIRE_FALSE(short_secret.ok());
  CHECK_THAT(std::string(short_secret.status().message()), Catch::Contains("key 9"));
  // The secret itself never appears in an error.
  CHECK_THAT(std::string(short_secret.status().message()),
             !Catch::Contains(std::string(kMinAuthSecret - 1, 's')));
  CHECK_FALSE(AuthKeyring::Create({{1, std::string(kMaxAuthSecret + 1, 's')}}).ok());

  auto ring = AuthKeyring::Create({{5, std::string(16, 'a')}, {6, std::string(20, 'b')}});
  REQUIRE(ring.ok());
  CHECK(ring->first().id == 5);
  REQUIRE(ring->Find(6) != nullptr);
  CHECK(ring->Find(6)->secret == std::string(20, 'b'));
  CHECK(ring->Find(7) == nullptr);
  CHECK(ring->Find(0) == nullptr);
}

TEST_CASE("the request's bytes: a key id and a nonce, zeros meaning no key") {
  AuthRequest request{42, {}};
  for (size_t i = 0; i < kAuthNonceSize; ++i) request.nonce[i] = static_cast<uint8_t>(0xa0 + i);
  uint8_t bytes[AuthRequest::kSize];
  EncodeAuthRequest(request, bytes);
  CHECK(bytes[0] == 42);  // little-endian
  CHECK(bytes[3] == 0);
  auto back = DecodeAuthRequest(bytes);
  REQUIRE(back.ok());
  CHECK(*back == request);

  // A keyless client's request: nothing after the Hello, or the CM's zero padding.
  REQUIRE(DecodeAuthRequest({}).ok());
  CHECK(DecodeAuthRequest({})->key_id == 0);
  const uint8_t zeros[AuthRequest::kSize] = {};
  REQUIRE(DecodeAuthRequest(zeros).ok());
  CHECK(DecodeAuthRequest(zeros)->key_id == 0);

  // A key id cut short, a nonce cut short (one byte short of the limit), a nonce of zeros.
  const uint8_t partial_id[2] = {1, 0};
  CHECK_FALSE(DecodeAuthRequest(partial_id).ok());
  CHECK_FALSE(DecodeAuthRequest(absl::MakeConstSpan(bytes, AuthRequest::kSize - 1)).ok());
  uint8_t zero_nonce[AuthRequest::kSize] = {42};
  auto refused = DecodeAuthRequest(zero_nonce);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("nonce of zeros"));
  static_assert(AuthRequest::kOffset + AuthRequest::kSize == kMaxConnectPrivateData);
}

TEST_CASE("the reply's bytes: the server's nonce and tag, zeros meaning it did not authenticate") {
  AuthReply reply;
  for (size_t i = 0; i < kAuthNonceSize; ++i) reply.nonce[i] = static_cast<uint8_t>(i + 1);
  for (size_t i = 0; i < kAuthTagSize; ++i) reply.tag[i] = static_cast<uint8_t>(0xff - i);
  uint8_t bytes[AuthReply::kSize];
  EncodeAuthReply(reply, bytes);
  auto back = DecodeAuthReply(bytes);
  REQUIRE(back.ok());
  CHECK(*back == reply);
  CHECK_FALSE(DecodeAuthReply(absl::MakeConstSpan(bytes, AuthReply::kSize - 1)).ok());
  // A reply without authentication reads as zeros (the CM pads the reply).
  const uint8_t zeros[AuthReply::kSize] = {};
  auto none = DecodeAuthReply(zeros);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("did not authenticate"));
  // It fits the reply beside the Hello and the accept data (the CM carries 196 bytes).
  static_assert(AuthReply::kOffset + AuthReply::kSize <= 196);
}

TEST_CASE("tags are HMAC-SHA256 over the documented transcript") {
  // Known answers, computed apart from zrpc (Python's hmac and struct over the layout auth.h
  // documents): they pin the wire format, so that a change to it cannot pass unnoticed.
  auto server = ComputeAuthTag(AuthRole::kServer, kKey, SampleTranscript());
  auto client = ComputeAuthTag(AuthRole::kClient, kKey, SampleTranscript());
  REQUIRE(server.ok());
  REQUIRE(client.ok());
  CHECK(Hex(*server) == "56677d8606c581743259ea7c47d3e8fb736d10d6b9e43bbfa2c9c30f5dd51d1d");
  CHECK(Hex(*client) == "35e34b659140867cde215d7274f1ea3ea8145350aa967e40c82a84199d6fb855");
}

TEST_CASE("a tag changes with every field of the transcript, the role and the key") {
  const AuthTag base = *ComputeAuthTag(AuthRole::kClient, kKey, SampleTranscript());
  CHECK(AuthTagMatches(base, *ComputeAuthTag(AuthRole::kClient, kKey, SampleTranscript())));
  // A tag reflected back is not the other side's.
  CHECK_FALSE(AuthTagMatches(base, *ComputeAuthTag(AuthRole::kServer, kKey, SampleTranscript())));
  AuthKey other = kKey;
  other.secret.back() ^= 1;
  CHECK_FALSE(AuthTagMatches(base, *ComputeAuthTag(AuthRole::kClient, other, SampleTranscript())));

  auto changed = [&](auto&& change) {
    AuthTranscript t = SampleTranscript();
    change(t);
    return !AuthTagMatches(base, *ComputeAuthTag(AuthRole::kClient, kKey, t));
  };
  CHECK(changed([](AuthTranscript& t) { t.key_id ^= 1; }));
  CHECK(changed([](AuthTranscript& t) { t.client_nonce[15] ^= 1; }));
  CHECK(changed([](AuthTranscript& t) { t.server_nonce[0] ^= 1; }));
  CHECK(changed([](AuthTranscript& t) { t.client_qp ^= 1; }));
  CHECK(changed([](AuthTranscript& t) { t.server_qp ^= 1; }));
  CHECK(changed([](AuthTranscript& t) { t.client_hello[35] ^= 1; }));
  CHECK(changed([](AuthTranscript& t) { t.server_hello[0] ^= 1; }));
  // The nonces swapped: each has its place.
  CHECK(changed([](AuthTranscript& t) { std::swap(t.client_nonce, t.server_nonce); }));
  // Any single bit of the tag.
  AuthTag flipped = base;
  flipped[31] ^= 0x80;
  CHECK_FALSE(AuthTagMatches(base, flipped));
}

TEST_CASE("nonces are fresh and never zeros") {
  auto a = NewAuthNonce();
  auto b = NewAuthNonce();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a != *b);
  CHECK(*a != AuthNonce{});
}

TEST_CASE("the nonce cache refuses a repeat and forgets the oldest past its capacity") {
  NonceCache cache(3);
  auto nonce = [](uint8_t n) {
    AuthNonce out{};
    out[0] = n;
    return out;
  };
  CHECK(cache.Insert(1, nonce(1)));
  CHECK_FALSE(cache.Insert(1, nonce(1)));  // the replay
  CHECK(cache.Insert(2, nonce(1)));        // the same nonce under another key is another entry
  CHECK(cache.Insert(1, nonce(2)));
  CHECK(cache.size() == 3);
  // At capacity: the next one pushes the oldest out, and the cache stays at its bound.
  CHECK(cache.Insert(1, nonce(3)));
  CHECK(cache.size() == 3);
  CHECK(cache.Insert(1, nonce(1)));  // forgotten: its replay would now fail on its tag instead
  CHECK_FALSE(cache.Insert(1, nonce(3)));
  CHECK(cache.size() == 3);
}

TEST_CASE("the first frames' bytes: the client's tag and arena, the server's arena and door") {
  AuthFrame frame;
  for (size_t i = 0; i < kAuthTagSize; ++i) frame.tag[i] = static_cast<uint8_t>(200 + i);
  frame.arena_addr = 0x00007f0011223340;
  frame.arena_rkey = 0xabcdef01;
  uint8_t bytes[AuthFrame::kSize + 1] = {};
  EncodeAuthFrame(frame, bytes);
  CHECK(bytes[kAuthTagSize] == 0x40);  // the address, least significant byte first
  CHECK(bytes[kAuthTagSize + 8] == 0x01);
  auto decoded = DecodeAuthFrame(absl::MakeConstSpan(bytes, AuthFrame::kSize));
  REQUIRE(decoded.ok());
  CHECK(*decoded == frame);
  CHECK_FALSE(DecodeAuthFrame(absl::MakeConstSpan(bytes, AuthFrame::kSize - 1)).ok());
  CHECK_FALSE(DecodeAuthFrame(absl::MakeConstSpan(bytes, AuthFrame::kSize + 1)).ok());

  AuthOkFrame ok;
  ok.arena_addr = 4096;
  ok.arena_rkey = 9;
  ok.door = ParkDoor{0x1000, 77, 0x5555};
  uint8_t ok_bytes[AuthOkFrame::kSize + 1] = {};
  EncodeAuthOkFrame(ok, ok_bytes);
  auto parks = DecodeAuthOkFrame(absl::MakeConstSpan(ok_bytes, AuthOkFrame::kSize), true);
  REQUIRE(parks.ok());
  CHECK(*parks == ok);
  // A door from a server whose Hello did not say it parks is refused, and a bad door too.
  CHECK_FALSE(DecodeAuthOkFrame(absl::MakeConstSpan(ok_bytes, AuthOkFrame::kSize), false).ok());
  CHECK_FALSE(DecodeAuthOkFrame(absl::MakeConstSpan(ok_bytes, AuthOkFrame::kSize - 1), true).ok());
  AuthOkFrame no_door = ok;
  no_door.door = ParkDoor{};
  EncodeAuthOkFrame(no_door, ok_bytes);
  CHECK(DecodeAuthOkFrame(absl::MakeConstSpan(ok_bytes, AuthOkFrame::kSize), false).ok());
  CHECK_FALSE(DecodeAuthOkFrame(absl::MakeConstSpan(ok_bytes, AuthOkFrame::kSize), true).ok());
}

TEST_CASE("a first frame's arena fits the Hello it follows") {
  Hello fixed;
  fixed.arena_size = 1 << 20;
  CHECK(CheckAuthArena(fixed, 0x10000, 5).ok());
  CHECK_FALSE(CheckAuthArena(fixed, ~uint64_t{0} - 100, 5).ok());  // wraps
  Hello none;
  CHECK(CheckAuthArena(none, 0, 0).ok());
  CHECK_FALSE(CheckAuthArena(none, 0x10000, 0).ok());
  CHECK_FALSE(CheckAuthArena(none, 0, 3).ok());
  Hello lent = fixed;
  lent.flags = kHelloArenaOnDemand;
  CHECK(CheckAuthArena(lent, 0, 0).ok());
  CHECK_FALSE(CheckAuthArena(lent, 0x10000, 5).ok());
}

TEST_CASE("a session checks the peer's tag, settles once, and forgets its secret then") {
  AuthSession server(AuthRole::kServer, kKey);
  AuthSession client(AuthRole::kClient, kKey);
  server.transcript() = SampleTranscript();
  client.transcript() = SampleTranscript();
  CHECK(server.key_id() == kKey.id);
  auto client_tag = client.OwnTag();
  auto server_tag = server.OwnTag();
  REQUIRE(client_tag.ok());
  REQUIRE(server_tag.ok());
  CHECK(server.CheckPeerTag(*client_tag).ok());
  CHECK(client.CheckPeerTag(*server_tag).ok());
  // A tag reflected back is not the other side's.
  absl::Status reflected = server.CheckPeerTag(*server_tag);
  CHECK(reflected.code() == absl::StatusCode::kPermissionDenied);
  CHECK(reflected.message().find("client's tag does not match key") != std::string::npos);
  CHECK(client.CheckPeerTag(*client_tag).code() == absl::StatusCode::kPermissionDenied);

  int heard = 0;
  absl::Status heard_outcome;
  server.set_on_finish([&](const absl::Status& outcome) {
    ++heard;
    heard_outcome = outcome;
  });
  CHECK_FALSE(server.finished());
  CHECK(server.outcome().code() == absl::StatusCode::kUnknown);
  CHECK_FALSE(server.Wait(absl::Now() + absl::Milliseconds(10)));
  CHECK(server.Finish(absl::OkStatus()));
  CHECK_FALSE(server.Finish(absl::DeadlineExceededError("late")));  // the first one wins
  CHECK(heard == 1);
  CHECK(heard_outcome.ok());
  CHECK(server.verified());
  CHECK(server.Wait(absl::InfinitePast()));
  CHECK(server.Settle(absl::CancelledError("no")).ok());
  // The secret is gone: no tag can be made or checked any more.
  CHECK(server.OwnTag().status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(server.CheckPeerTag(*client_tag).code() == absl::StatusCode::kFailedPrecondition);

  // Settle on a pending session sets it; a waiter on another thread wakes with it.
  std::thread waiter([&] { CHECK(client.Wait(absl::Now() + absl::Seconds(30))); });
  absl::Status settled = client.Settle(absl::DeadlineExceededError("gave up"));
  waiter.join();
  CHECK(settled.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(client.finished());
  CHECK_FALSE(client.verified());
}

}  // namespace
}  // namespace zrpc::transport
