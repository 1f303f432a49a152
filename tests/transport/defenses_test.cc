// A transport server against hostile and careless peers (tag "rdma"; tools/test runs it inside
// tools/softroce): hang-up storms, silent half-open handshakes, a peer asking for infinite RNR
// retries, a peer sending beyond its credits, a peer that never returns credits, hundreds of
// idle connections, and the limits that refuse the rest. Each case ends by showing that a fresh
// client is still served and that the server holds nothing for the peers that are gone.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/rdma_device.h"
#include "tests/transport/accept_queue.h"
#include "tests/transport/device_pollers.h"
#include "tests/transport/raw_peer.h"
#include "tests/transport/recorder.h"
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

// The server side of every case: echoes each message on the connection it came from, and
// counts what went wrong, for any number of connections.
class EchoServer : public ConnectionHandler {
 public:
  void OnMessage(Connection& c, const ReceivedMessage& m) override {
    absl::Status s;
    auto buffer = c.AcquireSendBuffer();
    if (buffer.ok()) {
      std::memcpy(buffer->data, m.data, std::min(m.size, buffer->capacity));
      s = c.Send(*buffer, m.size, 0);
    } else {
      s = buffer.status();
    }
    static_cast<void>(c.Release(m.handle));
    absl::MutexLock lock(&mu_);
    ++messages_;
    if (!s.ok()) {
      ++send_errors_;
      last_send_error_ = std::string(s.message());
    }
  }
  void OnBulk(Connection& c, const ReceivedBulk& b) override {
    static_cast<void>(c.Release(b.handle));
  }
  void OnSendDone(Connection&, uint64_t, const absl::Status&) override {}
  void OnClosed(Connection&, const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    closed_.push_back(std::string(why.message()));
  }

  uint64_t messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  uint64_t send_errors() {
    absl::MutexLock lock(&mu_);
    return send_errors_;
  }
  std::string last_send_error() {
    absl::MutexLock lock(&mu_);
    return last_send_error_;
  }
  std::vector<std::string> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  uint64_t messages_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t send_errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_send_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> closed_ ABSL_GUARDED_BY(mu_);
};

// A server (event-mode poller, echo handler, listener) and a client poller on one device.
// ~Server takes it down in order: connections, listener, then the pollers (which close and
// drain what is still open, calling `echo`), and only then `echo` itself.
struct Server : zrpc::testing::DevicePollers {
  std::unique_ptr<EchoServer> echo = std::make_unique<EchoServer>();
  std::unique_ptr<AcceptQueue> accepts;
  std::unique_ptr<Listener> listener;
  std::vector<std::shared_ptr<Connection>> accepted;

  Server(const DeviceConfig& config, const ListenerOptions& options = {},
         const PollerOptions& poller = EventMode())
      : DevicePollers(config, poller) {
    accepts = std::make_unique<AcceptQueue>(server_poller.get(), echo.get());
    auto l = Listener::Create(*device, "", 0, accepts.get(), options);
    INFO(l.status());
    REQUIRE(l.ok());
    listener = std::move(*l);
  }
  ~Server() {
    accepted.clear();
    listener.reset();
    accepts.reset();
    server_poller.reset();  // drains into echo's handlers
    client_poller.reset();
  }

  uint32_t SlotsInUse() const { return device->slots().slot_count() - device->slots().available(); }

  // Waits until `done` holds, polling (the listener and pollers work on their own threads).
  static bool Eventually(const std::function<bool()>& done, absl::Duration timeout = kTimeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  // A well-behaved zrpc client: connects, gets one echo back, hangs up. The proof that the
  // server still serves.
  absl::Status FreshClientEcho(absl::Duration connect_timeout = kTimeout) {
    Recorder handler;
    auto c = Connection::Connect(*device, *client_poller, device->selection().addr,
                                 listener->port(), &handler, {}, connect_timeout);
    if (!c.ok()) return c.status();
    auto buffer = (*c)->AcquireSendBuffer();
    if (!buffer.ok()) return buffer.status();
    std::memcpy(buffer->data, "ping", 4);
    if (auto s = (*c)->Send(*buffer, 4, 1); !s.ok()) return s;
    if (!handler.WaitFor([&] { return handler.messages.size() == 1; })) {
      return absl::DeadlineExceededError("no echo");
    }
    bool right = handler.WaitFor([&] { return handler.messages[0] == "ping"; });
    // The handler must outlive the connection, which lives until OnClosed.
    (*c)->Close();
    if (!handler.WaitFor([&] { return handler.closed.has_value(); })) {
      return absl::DeadlineExceededError("the client connection did not close");
    }
    return right ? absl::OkStatus() : absl::DataLossError("wrong echo");
  }

  // Waits until every connection has closed and been let go, and the pool holds what it held
  // at `slots_before`: nothing leaked.
  bool ReleasedEverything(uint32_t slots_before) {
    return Eventually([&] {
      TakeAccepted();
      accepted.erase(std::remove_if(accepted.begin(), accepted.end(),
                                    [](const auto& c) { return !c->open(); }),
                     accepted.end());
      return listener->connections() == 0 && SlotsInUse() == slots_before;
    });
  }

  // Takes what the listener accepted so far (keeping them alive like a server would).
  void TakeAccepted() {
    for (;;) {
      auto next = accepts->Next(absl::ZeroDuration());
      if (!next.ok()) return;
      accepted.push_back(*next);
    }
  }
};

}  // namespace

TEST_CASE("peers that hang up during or right after the handshake leave nothing behind",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config);
  uint32_t slots_before = server.SlotsInUse();
  constexpr int kPeers = 100;
  for (int i = 0; i < kPeers; ++i) {
    RawPeer peer;
    // Half finish the handshake and hang up at once; half leave before it ends.
    REQUIRE(peer.Connect(server.device->selection().addr, server.listener->port(), {},
                         /*finish=*/i % 2 == 0)
                .ok());
    server.TakeAccepted();
  }  // each RawPeer hangs up and is destroyed here
  REQUIRE(Server::Eventually([&] {
    server.TakeAccepted();
    return server.listener->connections() == 0 &&
           server.accepted.size() + server.accepts->refusals().size() == kPeers;
  }));
  std::printf(
      "hang-up storm: %zu accepted and closed, %zu refused or abandoned; "
      "connections now %u\n",
      server.accepted.size(), server.accepts->refusals().size(), server.listener->connections());
  CHECK(server.accepted.size() + server.accepts->refusals().size() == kPeers);
  CHECK(server.echo->closed().size() == server.accepted.size());
  for (auto& c : server.accepted) CHECK_FALSE(c->open());
  server.accepted.clear();
  CHECK(server.SlotsInUse() == slots_before);
  CHECK(server.FreshClientEcho().ok());
}

TEST_CASE("silent half-open handshakes delay nobody and expire on their own deadline",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  ListenerOptions options;
  options.handshake_timeout = absl::Seconds(4);
  Server server(config, options);
  uint32_t slots_before = server.SlotsInUse();
  std::vector<std::unique_ptr<RawPeer>> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(std::make_unique<RawPeer>());
    REQUIRE(silent.back()
                ->Connect(server.device->selection().addr, server.listener->port(), {},
                          /*finish=*/false)
                .ok());
  }
  REQUIRE(Server::Eventually([&] { return server.listener->handshakes() == 3; }));
  // A good client arriving now is served while the three still hang: with a connect timeout
  // shorter than the silent handshakes' own, it could not be if they were served one by one.
  absl::Time start = absl::Now();
  absl::Status fresh = server.FreshClientEcho(/*connect_timeout=*/absl::Seconds(3));
  INFO(fresh);
  CHECK(fresh.ok());
  std::printf("a good client behind 3 silent handshakes was served in %s\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  // Then each silent one is dropped when its own deadline passes.
  REQUIRE(Server::Eventually([&] { return server.listener->handshakes() == 0; }));
  std::vector<std::string> refusals = server.accepts->refusals();
  int expired = 0;
  for (const std::string& r : refusals) {
    expired += r.find("did not finish the handshake") != std::string::npos;
  }
  CHECK(expired == 3);
  CHECK(server.ReleasedEverything(slots_before));
}

TEST_CASE("a peer asking for infinite RNR retries is refused with the reason",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config);
  RawPeer greedy;
  RawPeer::Options options;
  options.rnr_retry = 7;
  absl::Status s =
      greedy.Connect(server.device->selection().addr, server.listener->port(), options);
  std::printf("infinite RNR retries: %s\n", s.ToString().c_str());
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(s.message().find("RNR retry count 7") != absl::string_view::npos);
  CHECK(server.listener->connections() == 0);
  CHECK(server.FreshClientEcho().ok());
}

TEST_CASE("a peer asking for transport retry count 7 (forever on rxe) is refused with the reason",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config);
  RawPeer forever;
  RawPeer::Options options;
  options.retry = 7;
  absl::Status s =
      forever.Connect(server.device->selection().addr, server.listener->port(), options);
  std::printf("retry count 7: %s\n", s.ToString().c_str());
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(s.message().find("retry count 7") != absl::string_view::npos);
  CHECK(server.listener->connections() == 0);
  CHECK(server.FreshClientEcho().ok());
}

TEST_CASE("a connecting peer whose Hello says it parks the server's window is refused",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config);
  // Only the accepting side parks (its door is in its reply): a request that parked the server's
  // sending would leave it with no credit and nowhere to knock.
  for (const uint16_t credits : {0, 4}) {
    INFO("claimed credits: " << credits);
    zrpc::transport::Hello h;
    h.flags = zrpc::transport::kHelloParks;
    h.recv_credits = credits;
    h.max_recv_credits = 4;
    h.recv_size = RawPeer::kSlot;
    RawPeer::Options options;
    options.hello.resize(zrpc::transport::Hello::kSize);
    zrpc::transport::EncodeHello(h, options.hello.data());
    RawPeer parker;
    absl::Status s =
        parker.Connect(server.device->selection().addr, server.listener->port(), options);
    std::printf("a request that parks the server: %s\n", s.ToString().c_str());
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(s.message().find("kHelloParks") != absl::string_view::npos);
  }
  CHECK(server.listener->connections() == 0);
  CHECK(server.FreshClientEcho().ok());
}

TEST_CASE("a peer sending beyond its credits is disconnected; others are not",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // Receives of the connection's own, or of the poller's shared queue (which the flood takes
  // from everyone until it is cut off, and from nobody after); and, with the shared queue, a
  // flood that starts as soon as the peer's side of the handshake is done, which may be before
  // the server's is (its excess is then dropped and the connection failed once the handshake
  // ends).
  PollerOptions poller = Server::EventMode();
  const int variant = GENERATE(0, 1, 2);
  poller.shared_receive_queue = variant == 0 ? 0 : 256;
  const bool at_once = variant == 2;
  INFO("shared receive queue: " << poller.shared_receive_queue << (at_once ? ", at once" : ""));
  Server server(config, {}, poller);
  uint32_t slots_before = server.SlotsInUse();
  RawPeer flood;
  REQUIRE(flood.Connect(server.device->selection().addr, server.listener->port(), {}).ok());
  auto accepted = [&] {
    return Server::Eventually([&] {
      server.TakeAccepted();
      return server.accepted.size() == 1;
    });
  };
  if (!at_once) REQUIRE(accepted());
  uint32_t window = flood.server_hello().recv_credits;
  // Credit frames only, returning nothing: the server must not answer them with data, so the
  // only credits the flood gets back are the server's own credit frames (a few, from the
  // flood's claimed window), far fewer than it sends.
  absl::Status s;
  int sent = 0;
  for (; sent < static_cast<int>(window) * 20 && s.ok() && server.echo->closed().empty(); ++sent) {
    s = flood.Send(FrameKind::kData, 0, 0, absl::Seconds(10));
  }
  std::printf("flood: %d frames sent for a window of %u (%lu credits returned); last: %s\n", sent,
              window, static_cast<unsigned long>(flood.credits_returned), s.ToString().c_str());
  if (at_once) REQUIRE(accepted());
  REQUIRE(Server::Eventually([&] { return !server.echo->closed().empty(); }));
  std::string why = server.echo->closed()[0];
  std::printf("closed: %s\n", why.c_str());
  INFO(why);
  CHECK(why.find("beyond its credits") != std::string::npos);
  CHECK(server.FreshClientEcho().ok());
  CHECK(server.ReleasedEverything(slots_before));
}

TEST_CASE("a peer that never returns credits holds at most max_send_slots of the shared pool",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Server server(config);
  uint32_t slots_before = server.SlotsInUse();
  RawPeer miser;
  RawPeer::Options options;
  options.claimed_credits = 4;
  options.posted_recvs = 4;
  REQUIRE(miser.Connect(server.device->selection().addr, server.listener->port(), options).ok());
  REQUIRE(Server::Eventually([&] {
    server.TakeAccepted();
    return server.accepted.size() == 1;
  }));
  // It keeps to its own credits, but gives the server back exactly one credit per credit frame
  // it receives: enough for the server to keep returning credits, never enough to send a reply
  // (data needs two). Every echo the server owes waits, in a slot of the shared pool.
  const uint32_t max_send_slots = ConnectionOptions{}.max_send_slots;
  int64_t credits = miser.server_hello().recv_credits;
  uint64_t credit_frames_seen = 0;
  uint32_t peak = 0;
  int sent = 0;
  for (; sent < static_cast<int>(max_send_slots) * 3; ++sent) {
    absl::Time deadline = absl::Now() + kTimeout;
    while (credits + static_cast<int64_t>(miser.credits_returned) - sent < 2) {
      REQUIRE(absl::Now() < deadline);  // the server keeps returning credits in credit frames
      miser.Poll();
    }
    uint16_t give = static_cast<uint16_t>(miser.credit_frames - credit_frames_seen);
    credit_frames_seen = miser.credit_frames;
    REQUIRE(miser.Send(FrameKind::kData, give, 16).ok());
    peak = std::max(peak, server.SlotsInUse() - slots_before);
  }
  REQUIRE(
      Server::Eventually([&] { return server.echo->messages() == static_cast<uint64_t>(sent); }));
  std::printf("miser: %d messages, %lu echoes refused (%s); pool slots held at peak %u\n", sent,
              static_cast<unsigned long>(server.echo->send_errors()),
              server.echo->last_send_error().c_str(), peak);
  CHECK(server.echo->send_errors() > 0);
  CHECK(server.echo->last_send_error().find("max_send_slots") != std::string::npos);
  // Its receives, its credit-frame slot and at most max_send_slots messages: nothing more.
  CHECK(peak <= ConnectionOptions{}.recv_credits + 1 + max_send_slots);
  CHECK(server.FreshClientEcho().ok());
  miser.Disconnect();
  CHECK(server.ReleasedEverything(slots_before));
}

TEST_CASE(
    "a server takes 256 idle connections and still serves calls, with default options or a shared "
    "receive queue",
    "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // Default options, or a shared receive queue backing windows of up to 8 (every option else the
  // default): then an idle connection holds its credit-frame slot and no receive of its own, and
  // the queue's receives are the poller's, held once.
  const bool shared = GENERATE(false, true);
  ListenerOptions listen;
  PollerOptions poller = Server::EventMode();
  if (shared) {
    listen.connection.recv_credits = 8;
    poller.shared_receive_queue = 8 * 260;
  }
  INFO((shared ? "shared receive queue of 2,080, windows of 8" : "default options"));
  Server server(config, listen, poller);
  uint32_t slots_before = server.SlotsInUse();
  size_t registered_before = server.device->slots().registered_bytes();
  // Light clients (this process plays all of them): the server side is what is measured.
  ConnectionOptions light;
  light.recv_credits = 4;
  light.arena_size = 0;
  light.send_queue_depth = 32;
  constexpr int kIdle = 256;
  std::vector<std::unique_ptr<Recorder>> handlers;
  std::vector<std::shared_ptr<Connection>> clients;
  for (int i = 0; i < kIdle; ++i) {
    handlers.push_back(std::make_unique<Recorder>());
    auto c =
        Connection::Connect(*server.device, *server.client_poller, server.device->selection().addr,
                            server.listener->port(), handlers.back().get(), light, kTimeout);
    INFO("connection " << i << ": " << c.status());
    REQUIRE(c.ok());
    clients.push_back(*c);
  }
  REQUIRE(Server::Eventually([&] {
    server.TakeAccepted();
    return server.accepted.size() == kIdle;
  }));
  CHECK(server.listener->connections() == kIdle);
  // What an idle connection costs: slots (the clients' counted apart) and registered memory.
  uint32_t client_slots = kIdle * (light.recv_credits + 1);
  double per_connection =
      static_cast<double>(server.SlotsInUse() - slots_before - client_slots) / kIdle;
  std::printf(
      "256 idle connections%s: %.1f server pool slots each (%zu KiB), pool %zu -> %zu MiB "
      "registered, plus a %u KiB arena each\n",
      shared ? " over a shared receive queue of 2,080 (8 MiB, held from the start)" : "",
      per_connection, static_cast<size_t>(per_connection * 4), registered_before >> 20,
      server.device->slots().registered_bytes() >> 20, ConnectionOptions{}.arena_size >> 10);
  CHECK(per_connection == Approx(shared ? 1 : ConnectionOptions{}.recv_credits + 1));
  // One more, that calls, is served; so are the first and the last of the idle ones.
  CHECK(server.FreshClientEcho().ok());
  for (int i : {0, kIdle - 1}) {
    auto buffer = clients[i]->AcquireSendBuffer();
    REQUIRE(buffer.ok());
    std::memcpy(buffer->data, "idle", 4);
    REQUIRE(clients[i]->Send(*buffer, 4, 1).ok());
    REQUIRE(handlers[i]->WaitFor([&] { return handlers[i]->messages.size() == 1; }));
  }
  for (auto& c : clients) c->Close();
  for (auto& h : handlers) REQUIRE(h->WaitFor([&] { return h->closed.has_value(); }));
  clients.clear();
  CHECK(server.ReleasedEverything(slots_before));
}

TEST_CASE("past max_connections and max_connections_per_peer a peer is refused: server full",
          "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  for (bool per_peer : {false, true}) {
    INFO((per_peer ? "per peer" : "in all"));
    ListenerOptions options;
    (per_peer ? options.max_connections_per_peer : options.max_connections) = 3;
    Recorder handler;  // outlives the server, whose client poller may still report to it
    Server server(config, options);
    std::vector<std::shared_ptr<Connection>> clients;
    for (int i = 0; i < 3; ++i) {
      auto c = Connection::Connect(*server.device, *server.client_poller,
                                   server.device->selection().addr, server.listener->port(),
                                   &handler, {}, kTimeout);
      REQUIRE(c.ok());
      clients.push_back(*c);
    }
    auto refused =
        Connection::Connect(*server.device, *server.client_poller, server.device->selection().addr,
                            server.listener->port(), &handler, {}, kTimeout);
    std::printf("a fourth client: %s\n", refused.status().ToString().c_str());
    CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
    CHECK(refused.status().message().find("server full") != absl::string_view::npos);
    CHECK(refused.status().message().find(per_peer
                                              ? "max_connections_per_peer"
                                              : "(max_connections)") != absl::string_view::npos);
    // A place comes back when a connection closes.
    clients.back()->Close();
    clients.pop_back();
    REQUIRE(Server::Eventually([&] { return server.listener->connections() == 2; }));
    server.TakeAccepted();
    server.accepted.clear();
    CHECK(server.FreshClientEcho().ok());
  }
}

TEST_CASE(
    "past accepts_per_second_per_peer an address is refused, server busy, until its bucket "
    "refills",
    "[rdma][transport][defenses]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  ListenerOptions options;
  options.accepts_per_second_per_peer = 1;
  options.accept_burst_per_peer = 3;
  Recorder handler;  // outlives the server, whose client poller may still report to it
  Server server(config, options);
  std::vector<std::shared_ptr<Connection>> clients;
  auto connect = [&] {
    return Connection::Connect(*server.device, *server.client_poller,
                               server.device->selection().addr, server.listener->port(), &handler,
                               {}, kTimeout);
  };
  const absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i) {  // the burst
    auto c = connect();
    INFO(c.status());
    REQUIRE(c.ok());
    clients.push_back(*c);
  }
  // Within a second of the first, no token has come back (one a second).
  auto refused = connect();
  const absl::Duration elapsed = absl::Now() - start;
  std::printf("a fourth request after %s: %s\n", absl::FormatDuration(elapsed).c_str(),
              refused.status().ToString().c_str());
  REQUIRE(elapsed < absl::Milliseconds(900));  // else the device is too slow to tell
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  CHECK(refused.status().message().find("server busy for") != absl::string_view::npos);
  CHECK(refused.status().message().find("(accepts_per_second_per_peer)") !=
        absl::string_view::npos);
  // A second later a token is back; the three open connections never counted against it.
  absl::SleepFor(absl::Milliseconds(1100));
  auto later = connect();
  INFO(later.status());
  CHECK(later.ok());
  if (later.ok()) clients.push_back(*later);
  for (auto& c : clients) c->Close();
  CHECK(Server::Eventually([&] { return server.listener->connections() == 0; }));
}
