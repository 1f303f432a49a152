// Peer authentication over a device (tag "rdma"; tools/test runs it inside tools/softroce):
// clients with the key connect, send and write bulk both ways; the five refusals (wrong key, no
// key, a replayed handshake, a peer that skips its tag, a tag that does not match) and key
// rotation. Each refusal is counted by its reason, tells the server's handler nothing, and
// leaves nothing behind; a client with the key is still served afterwards. Raw-verbs peers
// (raw_peer.h) play the clients that break the rules: they compute tags with the same library
// calls a client uses, so every refusal below is the server's check, not a malformed message.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tests/rdma_device.h"
#include "tests/transport/accept_queue.h"
#include "tests/transport/device_pollers.h"
#include "tests/transport/raw_peer.h"
#include "tests/transport/recorder.h"
#include "transport/auth.h"
#include "transport/auth_session.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/listener.h"
#include "transport/poller.h"

namespace {

using namespace zrpc::transport;  // NOLINT: a test of this namespace
using zrpc::testing::AcceptQueue;
using zrpc::testing::RawPeer;
using zrpc::testing::Recorder;

constexpr absl::Duration kTimeout = absl::Seconds(60);
const AuthKey kKey7{7, "seven-seven-seven-seven-seven-7!"};
const AuthKey kKey8{8, "eight-eight-eight-eight-eight-8!"};

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Echoes each message on the connection it came from; records bulk payloads and closes.
class Echo : public Recorder {
 public:
  void OnMessage(Connection& c, const ReceivedMessage& m) override {
    auto buffer = c.AcquireSendBuffer();
    if (buffer.ok()) {
      std::memcpy(buffer->data, m.data, std::min(m.size, buffer->capacity));
      static_cast<void>(c.Send(*buffer, m.size, 0));
    }
    Recorder::OnMessage(c, m);
  }
};

// A listener (its poller in event mode) and a client poller on one device. Taken down in order:
// connections, listener, pollers (which drain what is open into `echo`), then `echo`.
struct Server : zrpc::testing::DevicePollers {
  std::unique_ptr<Echo> echo = std::make_unique<Echo>();
  std::unique_ptr<AcceptQueue> accepts;
  std::unique_ptr<Listener> listener;
  std::vector<std::shared_ptr<Connection>> accepted;

  Server(const DeviceConfig& config, std::vector<AuthKey> keys,
         absl::Duration handshake_timeout = absl::Seconds(10),
         const PollerOptions& poller = EventMode(), const ConnectionOptions& connection = {})
      : DevicePollers(config, poller) {
    accepts = std::make_unique<AcceptQueue>(server_poller.get(), echo.get());
    ListenerOptions options;
    options.connection = connection;
    options.connection.auth_keys = std::move(keys);
    options.handshake_timeout = handshake_timeout;
    auto l = Listener::Create(*device, "", 0, accepts.get(), options);
    INFO(l.status());
    REQUIRE(l.ok());
    listener = std::move(*l);
  }
  ~Server() {
    accepted.clear();
    listener.reset();
    accepts.reset();
    server_poller.reset();
    client_poller.reset();
  }

  uint32_t SlotsInUse() const { return device->slots().slot_count() - device->slots().available(); }
  uint16_t port() const { return listener->port(); }
  const std::string& addr() const { return device->selection().addr; }

  static bool Eventually(const std::function<bool()>& done, absl::Duration timeout = kTimeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(Recorder& handler, std::vector<AuthKey> keys,
                                                      ConnectionOptions options = {},
                                                      uint16_t to_port = 0) {
    options.auth_keys = std::move(keys);
    return Connection::Connect(*device, *client_poller, addr(), to_port != 0 ? to_port : port(),
                               &handler, options, kTimeout);
  }

  // A client with `keys` connects, gets an echo back and hangs up: OK, or why not.
  absl::Status EchoWith(std::vector<AuthKey> keys) {
    Recorder handler;
    auto c = Connect(handler, std::move(keys));
    if (!c.ok()) return c.status();
    auto buffer = (*c)->AcquireSendBuffer();
    if (!buffer.ok()) return buffer.status();
    std::memcpy(buffer->data, "ping", 4);
    if (auto s = (*c)->Send(*buffer, 4, 1); !s.ok()) return s;
    const bool echoed = handler.WaitFor([&] { return handler.messages.size() == 1; });
    (*c)->Close();
    if (!handler.WaitFor([&] { return handler.closed.has_value(); })) {
      return absl::DeadlineExceededError("the client connection did not close");
    }
    return echoed ? absl::OkStatus() : absl::DeadlineExceededError("no echo");
  }

  // The next thing the listener reported: an accepted connection (kept) or a refusal.
  absl::Status NextOutcome() {
    auto next = accepts->Next(kTimeout);
    if (!next.ok()) return next.status();
    accepted.push_back(*next);
    return absl::OkStatus();
  }

  // Every connection closed and let go, the pool back where it was: nothing leaked.
  bool ReleasedEverything(uint32_t slots_before) {
    return Eventually([&] {
      accepted.erase(std::remove_if(accepted.begin(), accepted.end(),
                                    [](const auto& c) { return !c->open(); }),
                     accepted.end());
      return accepted.empty() && listener->connections() == 0 && listener->handshakes() == 0 &&
             SlotsInUse() == slots_before;
    });
  }
};

// A client by hand that authenticates as Connection::Connect does, or breaks the rules where a
// case says: the request's bytes, the server's reply checked, its own tag.
struct RawClient {
  RawPeer peer;
  std::unique_ptr<AuthSession> session;
  AuthNonce nonce{};

  // Sends the request with `key` (its id and a fresh nonce, or `nonce` when given) and finishes
  // the CM handshake; the server's tag is checked against `key`'s secret.
  absl::Status Connect(const Server& server, const AuthKey& key, const AuthNonce* reuse = nullptr) {
    if (reuse != nullptr) {
      nonce = *reuse;
    } else {
      auto fresh = NewAuthNonce();
      if (!fresh.ok()) return fresh.status();
      nonce = *fresh;
    }
    session = std::make_unique<AuthSession>(AuthRole::kClient, key);
    RawPeer::Options options;
    Hello hello;
    hello.flags = kHelloAuth;
    hello.recv_credits = options.claimed_credits;
    hello.max_recv_credits = options.claimed_credits;
    hello.recv_size = RawPeer::kSlot;
    options.hello.resize(AuthRequest::kOffset + AuthRequest::kSize);
    EncodeHello(hello, options.hello.data());
    EncodeAuthRequest(AuthRequest{key.id, nonce}, options.hello.data() + AuthRequest::kOffset);
    if (auto s = peer.Connect(server.addr(), server.port(), options); !s.ok()) return s;
    AuthTranscript& t = session->transcript();
    t.client_nonce = nonce;
    t.client_qp = peer.qp_num();
    t.server_qp = peer.remote_qp_num();
    std::copy(options.hello.begin(), options.hello.begin() + Hello::kSize, t.client_hello.begin());
    const std::vector<uint8_t>& reply = peer.reply();
    if (reply.size() < AuthReply::kOffset + AuthReply::kSize) {
      return absl::DataLossError(absl::StrCat("the reply has ", reply.size(), " bytes"));
    }
    std::copy(reply.begin(), reply.begin() + Hello::kSize, t.server_hello.begin());
    auto decoded = DecodeAuthReply(absl::MakeConstSpan(reply).subspan(AuthReply::kOffset));
    if (!decoded.ok()) return decoded.status();
    t.server_nonce = decoded->nonce;
    return session->CheckPeerTag(decoded->tag);
  }

  // Sends the kAuth frame with `tag` (its own when null), and waits for its completion.
  absl::Status SendTag(const AuthTag* tag = nullptr) {
    AuthFrame frame;
    if (tag != nullptr) {
      frame.tag = *tag;
    } else {
      auto own = session->OwnTag();
      if (!own.ok()) return own.status();
      frame.tag = *own;
    }
    EncodeAuthFrame(frame, peer.payload());
    return peer.Send(FrameKind::kAuth, 0, AuthFrame::kSize);
  }
};

}  // namespace

TEST_CASE("clients with the key connect, send and write bulk both ways; the server counts them",
          "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config, {kKey7});
  const uint32_t slots_before = server.SlotsInUse();
  Recorder client_handler;
  auto client = server.Connect(client_handler, {kKey7});
  INFO(client.status());
  REQUIRE(client.ok());
  // Connect returns once the server has confirmed: the connection is whole at once.
  CHECK((*client)->open());
  CHECK((*client)->auth_key_id() == 7);
  REQUIRE(server.NextOutcome().ok());
  std::shared_ptr<Connection> accepted = server.accepted.back();
  CHECK(accepted->auth_key_id() == 7);
  CHECK(server.listener->auth_counts().authenticated == 1);
  CHECK(server.listener->auth_counts().refused() == 0);
  CHECK(server.listener->handshakes() == 0);

  // Messages, and the whole window: the kAuthOk returned every credit the Hello held back.
  for (int i = 0; i < 40; ++i) {
    auto buffer = (*client)->AcquireSendBuffer();
    REQUIRE(buffer.ok());
    const std::string text = absl::StrCat("message ", i);
    std::memcpy(buffer->data, text.data(), text.size());
    REQUIRE((*client)->Send(*buffer, static_cast<uint32_t>(text.size()), 100 + i).ok());
  }
  REQUIRE(client_handler.WaitFor([&] { return client_handler.messages.size() == 40; }));
  CHECK((*client)->stats().peer_max_recv_credits == ConnectionOptions{}.recv_credits);

  // Bulk both ways: each side's arena key travelled in its first frame, not in its Hello.
  std::vector<uint8_t> source(64 << 10, 0x5a);
  auto region = server.device->RegisterMemory(source.data(), source.size());
  REQUIRE(region.ok());
  REQUIRE((*client)->WriteBulk(BulkSource{source.data(), 64 << 10, (*region)->lkey()}, 1).ok());
  REQUIRE(server.echo->WaitFor([&] { return server.echo->bulks.size() == 1; }));
  REQUIRE(accepted->WriteBulk(BulkSource{source.data(), 32 << 10, (*region)->lkey()}, 2).ok());
  REQUIRE(client_handler.WaitFor([&] { return client_handler.bulks.size() == 1; }));
  {
    absl::MutexLock lock(&client_handler.mu);
    CHECK(client_handler.bulks[0] == std::string(32 << 10, 0x5a));
  }
  (*client)->Close();
  REQUIRE(client_handler.WaitFor([&] { return client_handler.closed.has_value(); }));
  client->reset();
  accepted.reset();
  CHECK(server.ReleasedEverything(slots_before));
  CHECK(server.echo->WaitFor([&] { return server.echo->closed.has_value(); }));
}

TEST_CASE("a wrong key, no key, an unknown key and a keyless server are refused, saying why",
          "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config, {kKey7});
  const uint32_t slots_before = server.SlotsInUse();

  // The same id with another secret: the client finds the server's tag wrong and hangs up;
  // the server counts a client that never sent its tag.
  AuthKey wrong = kKey7;
  wrong.secret[0] ^= 1;
  absl::Status wrong_key = server.EchoWith({wrong});
  INFO(wrong_key);
  CHECK(wrong_key.code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(wrong_key.message(), "server's tag does not match key 7"));
  CHECK(Server::Eventually([&] { return server.listener->auth_counts().refused_no_tag == 1; }));

  absl::Status no_key = server.EchoWith({});
  INFO(no_key);
  CHECK_FALSE(no_key.ok());
  CHECK(Contains(no_key.message(), "admits only clients that present a key"));
  CHECK(server.listener->auth_counts().refused_no_key == 1);

  absl::Status unknown = server.EchoWith({kKey8});
  INFO(unknown);
  CHECK_FALSE(unknown.ok());
  CHECK(Contains(unknown.message(), "presents key 8, which this server does not hold"));
  CHECK(server.listener->auth_counts().refused_unknown_key == 1);

  // The server's handler heard of none of them, and nothing is held for them.
  CHECK(server.ReleasedEverything(slots_before));
  CHECK(server.accepts->accepted() == 0);
  {
    absl::MutexLock lock(&server.echo->mu);
    CHECK_FALSE(server.echo->closed.has_value());
    CHECK(server.echo->message_count == 0);
  }
  CHECK(server.EchoWith({kKey7}).ok());
  CHECK(server.listener->auth_counts().authenticated == 1);

  // A server without keys refuses a client that presents one (it could not answer its tag).
  Server keyless(config, {});
  absl::Status unexpected = keyless.EchoWith({kKey7});
  INFO(unexpected);
  CHECK_FALSE(unexpected.ok());
  CHECK(Contains(unexpected.message(), "authenticates no one"));
  CHECK(keyless.listener->auth_counts().refused_unexpected_key == 1);
  CHECK(keyless.EchoWith({}).ok());
}

TEST_CASE("until its tag is checked a client gets one credit and no memory key",
          "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config, {kKey7});
  RawClient raw;
  REQUIRE(raw.Connect(server, kKey7).ok());
  const Hello& hello = raw.peer.server_hello();
  CHECK((hello.flags & kHelloAuth) != 0);
  CHECK(hello.recv_credits == 1);
  CHECK(hello.max_recv_credits == ConnectionOptions{}.recv_credits);
  CHECK(hello.arena_addr == 0);
  CHECK(hello.arena_rkey == 0);
  CHECK(hello.arena_size == ConnectionOptions{}.arena_size);
  // Its tag: the server answers kAuthOk with the whole window and its arena, and accepts.
  REQUIRE(raw.SendTag().ok());
  REQUIRE(Server::Eventually([&] {
    raw.peer.Poll();
    return raw.peer.auth_ok_frames == 1;
  }));
  CHECK(raw.peer.credits_returned == ConnectionOptions{}.recv_credits);
  REQUIRE(server.NextOutcome().ok());
  CHECK(server.listener->auth_counts().authenticated == 1);

  // One credit is the server's provisional window; a client offering it is refused.
  RawPeer greedy;
  RawPeer::Options options;
  Hello hello_of_one;
  hello_of_one.flags = kHelloAuth;
  hello_of_one.recv_credits = 1;
  hello_of_one.max_recv_credits = options.claimed_credits;
  hello_of_one.recv_size = RawPeer::kSlot;
  options.hello.resize(AuthRequest::kOffset + AuthRequest::kSize);
  EncodeHello(hello_of_one, options.hello.data());
  auto nonce = NewAuthNonce();
  REQUIRE(nonce.ok());
  EncodeAuthRequest(AuthRequest{kKey7.id, *nonce}, options.hello.data() + AuthRequest::kOffset);
  absl::Status refused = greedy.Connect(server.addr(), server.port(), options);
  INFO(refused);
  CHECK(Contains(refused.message(), "offers 1 receive credits"));
}

TEST_CASE("a replayed handshake and a tag from another handshake are refused",
          "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config, {kKey7});
  const uint32_t slots_before = server.SlotsInUse();
  RawClient first;
  REQUIRE(first.Connect(server, kKey7).ok());
  auto first_tag = first.session->OwnTag();
  REQUIRE(first_tag.ok());
  REQUIRE(first.SendTag().ok());
  REQUIRE(server.NextOutcome().ok());

  // The same request again (its nonce): refused at once, before anything is made for it.
  RawClient replay;
  absl::Status replayed = replay.Connect(server, kKey7, &first.nonce);
  INFO(replayed);
  CHECK_FALSE(replayed.ok());
  CHECK(Contains(replayed.message(), "repeats a nonce"));
  CHECK(server.listener->auth_counts().refused_replay == 1);
  auto refusal = server.accepts->Next(kTimeout);
  CHECK_FALSE(refusal.ok());

  // A fresh request whose kAuth carries the first handshake's tag: the server's nonce and both
  // queue pairs differ, so it does not match.
  RawClient recorded;
  REQUIRE(recorded.Connect(server, kKey7).ok());
  REQUIRE(recorded.SendTag(&*first_tag).ok());
  auto bad_tag = server.accepts->Next(kTimeout);
  REQUIRE_FALSE(bad_tag.ok());
  CHECK(bad_tag.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(bad_tag.status().message(), "client's tag does not match key 7"));
  CHECK(server.listener->auth_counts().refused_bad_tag == 1);
  CHECK(server.listener->auth_counts().authenticated == 1);

  first.peer.Disconnect();
  recorded.peer.Disconnect();
  CHECK(server.ReleasedEverything(slots_before));
  {
    absl::MutexLock lock(&server.echo->mu);
    CHECK(server.echo->message_count == 0);
  }
}

TEST_CASE("a peer that skips its tag is refused: data first, a bulk write first, or nothing",
          "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config, {kKey7}, /*handshake_timeout=*/absl::Seconds(2));
  const uint32_t slots_before = server.SlotsInUse();

  RawClient data_first;
  REQUIRE(data_first.Connect(server, kKey7).ok());
  std::memcpy(data_first.peer.payload(), "let me in", 9);
  REQUIRE(data_first.peer.Send(FrameKind::kData, 0, 9).ok());
  auto refused = server.accepts->Next(kTimeout);
  REQUIRE_FALSE(refused.ok());
  CHECK(Contains(refused.status().message(), "before its tag"));

  RawClient bulk_first;
  REQUIRE(bulk_first.Connect(server, kKey7).ok());
  // It has no key for the arena (nor does the server's Hello give one): the write fails at the
  // server's NIC, which fails the connection before anything reaches the layer above.
  bulk_first.peer.WriteRaw(0, 0, 64, absl::Seconds(10), /*imm=*/0);
  refused = server.accepts->Next(kTimeout);
  REQUIRE_FALSE(refused.ok());

  // Nothing at all: refused when handshake_timeout has passed since its request.
  const absl::Time silent_since = absl::Now();
  RawClient silent;
  REQUIRE(silent.Connect(server, kKey7).ok());
  refused = server.accepts->Next(kTimeout);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - silent_since >= absl::Seconds(2));
  CHECK(server.listener->auth_counts().refused_no_tag == 3);
  CHECK(server.listener->auth_counts().authenticated == 0);

  data_first.peer.Disconnect();
  bulk_first.peer.Disconnect();
  silent.peer.Disconnect();
  CHECK(server.ReleasedEverything(slots_before));
  {
    absl::MutexLock lock(&server.echo->mu);
    CHECK(server.echo->message_count == 0);
    CHECK(server.echo->bulks.empty());
    CHECK_FALSE(server.echo->closed.has_value());
  }
  CHECK(server.EchoWith({kKey7}).ok());
}

TEST_CASE("keys rotate without a restart: old and new accepted, then the old refused",
          "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config, {kKey7, kKey8});
  CHECK(server.EchoWith({kKey7}).ok());
  CHECK(server.EchoWith({kKey8}).ok());
  // A connection made with the old key outlives the rotation.
  Recorder handler;
  auto old = server.Connect(handler, {kKey7});
  REQUIRE(old.ok());
  REQUIRE(server.listener->SetAuthKeys({kKey8}).ok());
  absl::Status retired = server.EchoWith({kKey7});
  INFO(retired);
  CHECK(Contains(retired.message(), "presents key 7, which this server does not hold"));
  CHECK(server.EchoWith({kKey8}).ok());
  auto buffer = (*old)->AcquireSendBuffer();
  REQUIRE(buffer.ok());
  std::memcpy(buffer->data, "still here", 10);
  REQUIRE((*old)->Send(*buffer, 10, 1).ok());
  CHECK(handler.WaitFor([&] { return handler.messages.size() == 1; }));
  // A keyring the listener cannot use leaves the old one in place.
  CHECK(server.listener->SetAuthKeys({{9, "short"}}).code() == absl::StatusCode::kInvalidArgument);
  CHECK(server.EchoWith({kKey8}).ok());
  const Listener::AuthCounts counts = server.listener->auth_counts();
  CHECK(counts.authenticated == 5);
  CHECK(counts.refused_unknown_key == 1);
  (*old)->Close();
  CHECK(handler.WaitFor([&] { return handler.closed.has_value(); }));
}

TEST_CASE(
    "on a poller that parks, a client that authenticates takes a floor or is refused; "
    "its door comes with the kAuthOk, and its knocks open its window",
    "[rdma][transport][auth]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // 16 shared receives: 4 floors of 3, and 4 of growth.
  PollerOptions parking = Server::EventMode();
  parking.shared_receive_queue = 16;
  parking.park_windows = true;
  ConnectionOptions window;
  window.recv_credits = 4;
  window.idle_recv_credits = 3;
  std::vector<std::unique_ptr<Recorder>> handlers;  // outlive the pollers' connections
  Server server(config, {kKey7}, absl::Seconds(10), parking, window);
  // A keyless listener on the same poller: its clients start parked when the floors are gone.
  ListenerOptions open_options;
  open_options.connection = window;
  auto open = Listener::Create(*server.device, "", 0, server.accepts.get(), open_options);
  REQUIRE(open.ok());

  std::vector<std::shared_ptr<Connection>> keyed;
  for (int i = 0; i < 4; ++i) {
    handlers.push_back(std::make_unique<Recorder>());
    auto c = server.Connect(*handlers.back(), {kKey7}, window);
    INFO(c.status());
    REQUIRE(c.ok());
    keyed.push_back(*c);
    REQUIRE(server.NextOutcome().ok());
  }
  // No floor is left, and a client that authenticates cannot start parked: refused, saying so.
  handlers.push_back(std::make_unique<Recorder>());
  auto fifth = server.Connect(*handlers.back(), {kKey7}, window);
  REQUIRE_FALSE(fifth.ok());
  CHECK(Contains(fifth.status().message(), "cannot start parked"));
  CHECK_FALSE(server.accepts->Next(kTimeout).ok());

  // A keyless client starts parked and knocks: the poller parks an idle window that
  // authenticated to give it a floor.
  handlers.push_back(std::make_unique<Recorder>());
  Recorder& parked_handler = *handlers.back();
  auto parked = server.Connect(parked_handler, {}, window, (*open)->port());
  REQUIRE(parked.ok());
  REQUIRE(server.NextOutcome().ok());
  auto send = [](Connection& c, absl::string_view text) {
    auto buffer = c.AcquireSendBuffer();
    if (!buffer.ok()) return buffer.status();
    std::memcpy(buffer->data, text.data(), text.size());
    return c.Send(*buffer, static_cast<uint32_t>(text.size()), 0);
  };
  REQUIRE(send(**parked, "knock knock").ok());
  REQUIRE(parked_handler.WaitFor([&] { return parked_handler.messages.size() == 1; }));
  REQUIRE(Server::Eventually([&] {
    for (const auto& c : server.accepted) {
      if (c->auth_key_id() == 7 && c->stats().parks > 0) return true;
    }
    return false;
  }));
  // Every client that authenticated sends again: a parked one knocks on the door its kAuthOk
  // gave, and is heard (the door is not foreign), and its window opens.
  for (size_t i = 0; i < keyed.size(); ++i) {
    REQUIRE(send(*keyed[i], "again").ok());
    INFO("client " << i);
    REQUIRE(handlers[i]->WaitFor([&] { return handlers[i]->messages.size() == 1; }));
  }
  uint64_t knocks = 0;
  for (const auto& c : keyed) knocks += c->stats().knocks;
  CHECK(knocks >= 1);
  CHECK(server.server_poller->foreign_knocks() == 0);
  CHECK(server.listener->auth_counts().authenticated == 4);
  for (const auto& c : keyed) c->Close();
  (*parked)->Close();
  for (auto& handler : handlers) {
    if (handler.get() == handlers[4].get()) continue;  // the refused one never had a connection
    CHECK(handler->WaitFor([&] { return handler->closed.has_value(); }));
  }
  open->reset();
}
