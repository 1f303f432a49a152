// Arenas lent on demand (transport/arena.h, "Loans"; arena_pool.h): a connection that lends its
// arena registers none until its peer writes a bulk payload, borrows a piece of its poller's
// pool for it, gives it back when recalled, and a poller short of pieces recalls idle loans so
// that every connection that asks gets one. The key of a loan works only on its own connection.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/eventually.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/raw_peer.h"
#include "tests/transport/recorder.h"
#include "transport/arena_pool.h"
#include "transport/connection.h"
#include "transport/poller.h"
#ifdef ZRPC_OVER_FAKEVERBS
#include "tests/fakeverbs/fake_device.h"
#define ZRPC_TEST_DEVICE(var) const DeviceConfig var = zrpc::fakeverbs::FakeDevice()
#else
#include "tests/rdma_device.h"
#define ZRPC_TEST_DEVICE(var) ZRPC_REQUIRE_RDMA_DEVICE(var)
#endif

namespace zrpc::transport {

// Reads what a lend told the peer: the test stands in for a peer that steals the key.
class ConnectionTestPeer {
 public:
  static uint32_t LentKey(Connection& c) {
    c.EnterWaiting();
    const uint32_t key = c.lend_rkey_;
    c.ExitLocked();
    return key;
  }
  static uint64_t LentAddress(Connection& c) {
    c.EnterWaiting();
    const auto addr = reinterpret_cast<uint64_t>(c.arena_base_);
    c.ExitLocked();
    return addr;
  }
};

}  // namespace zrpc::transport

namespace {

using zrpc::testing::ConnectPair;
using zrpc::testing::Eventually;
using zrpc::testing::kTimeout;
using zrpc::testing::Pair;
using zrpc::testing::RawPeer;
using zrpc::testing::Recorder;
using zrpc::testing::Setup;
using zrpc::transport::BulkSource;
using zrpc::transport::Connection;
using zrpc::transport::ConnectionOptions;
using zrpc::transport::ConnectionStats;
using zrpc::transport::ConnectionTestPeer;
using zrpc::transport::DeviceConfig;
using zrpc::transport::MemoryRegion;
using zrpc::transport::PollerOptions;
using zrpc::transport::PollMode;

constexpr uint32_t kPiece = 64 * 1024;

PollerOptions Lending(uint32_t pieces) {
  PollerOptions options;
  options.mode = PollMode::kEvent;
  options.arena_pool_pieces = pieces;
  options.arena_piece_size = kPiece;
  return options;
}

ConnectionOptions OnDemand() {
  ConnectionOptions options;
  options.arena_size = kPiece;
  options.arena_on_demand = true;
  return options;
}

// A registered source of bulk payloads: byte i of payload `tag` is tag + i.
struct Source {
  std::string bytes = std::string(kPiece, '\0');
  std::unique_ptr<MemoryRegion> region;
  explicit Source(zrpc::transport::Device& device) {
    auto r = device.RegisterMemory(bytes.data(), bytes.size());
    REQUIRE(r.ok());
    region = std::move(*r);
  }
  BulkSource Payload(uint8_t tag, uint32_t size) {
    for (uint32_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(tag + i);
    return BulkSource{bytes.data(), size, region->lkey()};
  }
};

std::string Expected(uint8_t tag, uint32_t size) {
  std::string s(size, '\0');
  for (uint32_t i = 0; i < size; ++i) s[i] = static_cast<char>(tag + i);
  return s;
}

// Writes `size` bytes tagged `tag` from `client` and waits until `server_side` has them.
void WriteAndCheck(Connection& client, Recorder& client_handler, Recorder& server_side,
                   Source& source, uint8_t tag, uint32_t size, uint64_t token) {
  size_t before = 0;
  {
    absl::MutexLock lock(&server_side.mu);
    before = server_side.bulks.size();
  }
  REQUIRE(client.WriteBulk(source.Payload(tag, size), token).ok());
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(token) > 0; }));
  {
    absl::MutexLock lock(&client_handler.mu);
    INFO(client_handler.done[token]);
    REQUIRE(client_handler.done[token].ok());
  }
  REQUIRE(server_side.WaitFor([&] { return server_side.bulks.size() > before; }));
  absl::MutexLock lock(&server_side.mu);
  CHECK(server_side.bulks.back() == Expected(tag, size));
}

// Another connection to the listener ConnectPair's first one made (its options).
Pair ConnectAnother(Setup& setup, Recorder* server_side, Recorder* client_side) {
  setup.accepts->Use(setup.server_poller.get(), server_side);
  auto client =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), client_side, {}, kTimeout);
  REQUIRE(client.ok());
  auto server = setup.accepts->Next(kTimeout);
  REQUIRE(server.ok());
  return Pair{*server, *client};
}

TEST_CASE("an arena lent on demand: none until the peer writes, then one loan for its writes",
          "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server, client;  // outlive the pollers, which call them until they stop
  Setup setup(config, Lending(2));
  REQUIRE(setup.server_poller->arena_pool() != nullptr);
  Pair pair = ConnectPair(setup, &server, &client, OnDemand());
  CHECK(pair.client->peer_arena_size() == kPiece);
  // Idle: nothing registered, nothing lent.
  CHECK(setup.server_poller->arena_pool()->made() == 0);
  CHECK_FALSE(pair.server->stats().arena_lent);
  // What it holds registered: slots only (whole ones), no arena.
  const uint64_t idle_registered = pair.server->stats().registered_bytes;
  const size_t slot_size = setup.device->slots().slot_size();
  CHECK(idle_registered >= slot_size);
  CHECK(idle_registered % slot_size == 0);

  Source source(*setup.device);
  WriteAndCheck(*pair.client, client, server, source, 1, 1000, 1);
  ConnectionStats s = pair.server->stats();
  CHECK(s.arena_loans == 1);
  CHECK(s.arena_lent);
  CHECK(s.registered_bytes == idle_registered + kPiece);  // the piece lent, counted while held
  CHECK(pair.client->stats().arena_asks == 1);
  CHECK(setup.server_poller->arena_pool()->made() == 1);
  // More writes, as large as the loan, travel in it: no more asks.
  for (uint8_t i = 2; i < 10; ++i) {
    WriteAndCheck(*pair.client, client, server, source, i, i % 2 ? kPiece : 4096, i);
  }
  CHECK(pair.client->stats().arena_asks == 1);
  CHECK(pair.server->stats().arena_loans == 1);
  // Nobody else waits: the loan stays (a pool with room recalls nothing).
  CHECK(pair.server->stats().arena_recalls == 0);
}

TEST_CASE("a poller short of arenas recalls idle loans, and every connection that asks gets one",
          "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  std::vector<std::unique_ptr<Recorder>> servers, clients;
  Setup setup(config, Lending(1));
  constexpr int kConnections = 3;
  std::vector<Pair> pairs;
  zrpc::transport::ListenerOptions listen;
  listen.connection = OnDemand();
  setup.Listen(listen);
  for (int i = 0; i < kConnections; ++i) {
    servers.push_back(std::make_unique<Recorder>());
    clients.push_back(std::make_unique<Recorder>());
    setup.accepts->Use(setup.server_poller.get(), servers.back().get());
    auto client =
        Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                            setup.listener->port(), clients.back().get(), {}, kTimeout);
    REQUIRE(client.ok());
    auto server = setup.accepts->Next(kTimeout);
    REQUIRE(server.ok());
    pairs.push_back(Pair{*server, *client});
  }
  Source source(*setup.device);
  // Round after round, each connection writes in turn: one piece serves them all.
  uint64_t token = 1;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kConnections; ++i) {
      WriteAndCheck(*pairs[i].client, *clients[i], *servers[i], source, static_cast<uint8_t>(token),
                    8192, token);
      ++token;
    }
  }
  uint64_t loans = 0, recalls = 0, waits = 0;
  for (const Pair& p : pairs) {
    ConnectionStats s = p.server->stats();
    loans += s.arena_loans;
    recalls += s.arena_recalls;
    waits += s.arena_waits;
  }
  INFO("loans " << loans << ", recalls " << recalls << ", waits " << waits);
  CHECK(setup.server_poller->arena_pool()->made() == 1);
  CHECK(loans >= kConnections * 3 - 1);  // each turn after the first needs the piece back
  CHECK(recalls >= loans - 1);
  CHECK(waits >= 1);
  CHECK(setup.server_poller->arena_waits() >= 1);
  for (const Pair& p : pairs) CHECK(p.server->open());
}

TEST_CASE("a loan whose payloads the application holds is not recalled until they are released",
          "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server_a, client_a, server_b, client_b;
  Setup setup(config, Lending(1));
  server_a.hold_bulks = true;
  Pair a = ConnectPair(setup, &server_a, &client_a, OnDemand());
  Pair b = ConnectAnother(setup, &server_b, &client_b);
  Source source_a(*setup.device), source_b(*setup.device);
  WriteAndCheck(*a.client, client_a, server_a, source_a, 7, 5000, 1);
  // B asks while A holds the only piece with a payload in it: its piece could not go back before
  // the payload is released, so A's loan is not recalled (B waits; A's next write would not).
  REQUIRE(b.client->WriteBulk(source_b.Payload(9, 3000), 2).ok());
  REQUIRE(Eventually([&] { return b.server->stats().arena_waits >= 1; }, kTimeout));
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(a.server->stats().arena_recalls == 0);
  {
    absl::MutexLock lock(&server_b.mu);
    CHECK(server_b.bulks.empty());
  }
  CHECK(a.server->stats().arena_lent);
  // Released: the piece goes to B, whose payload arrives intact.
  uint64_t handle = 0;
  {
    absl::MutexLock lock(&server_a.mu);
    REQUIRE(server_a.held_bulks.size() == 1);
    handle = server_a.held_bulks[0];
  }
  REQUIRE(a.server->Release(handle).ok());
  REQUIRE(server_b.WaitFor([&] { return server_b.bulks.size() == 1; }));
  {
    absl::MutexLock lock(&server_b.mu);
    CHECK(server_b.bulks[0] == Expected(9, 3000));
  }
  CHECK(a.server->stats().arena_recalls == 1);
  CHECK_FALSE(a.server->stats().arena_lent);
  CHECK(b.server->stats().arena_lent);
  CHECK(a.server->open());
}

// Before: a loan used since the poller's last look (every 10 ms while others wait) was never
// recalled, so a peer writing a payload every few milliseconds kept its piece for good, and one
// client could hold a poller's whole pool so. Now a loan held for Connection::kLoanTurn while
// others wait is recalled even so.
TEST_CASE("a connection that keeps writing gives its loan up after its turn while another waits",
          "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server_a, client_a, server_b, client_b;
  Setup setup(config, Lending(1));
  Pair a = ConnectPair(setup, &server_a, &client_a, OnDemand());
  Pair b = ConnectAnother(setup, &server_b, &client_b);
  Source source_a(*setup.device), source_b(*setup.device);
  uint64_t token = 1;
  WriteAndCheck(*a.client, client_a, server_a, source_a, 1, 2000, token++);
  REQUIRE(b.client->WriteBulk(source_b.Payload(9, 3000), 1000).ok());
  // A writes every 2 ms, each payload released on arrival: its loan is never idle at a look.
  const absl::Time started = absl::Now();
  auto b_arrived = [&] {
    absl::MutexLock lock(&server_b.mu);
    return !server_b.bulks.empty();
  };
  while (!b_arrived() && absl::Now() - started < absl::Seconds(5)) {
    WriteAndCheck(*a.client, client_a, server_a, source_a, static_cast<uint8_t>(token), 2000,
                  token);
    ++token;
    absl::SleepFor(absl::Milliseconds(2));
  }
  const absl::Duration waited = absl::Now() - started;
  INFO("B waited " << absl::FormatDuration(waited) << " while A wrote " << token - 2
                   << " payloads");
  REQUIRE(b_arrived());
  {
    absl::MutexLock lock(&server_b.mu);
    CHECK(server_b.bulks[0] == Expected(9, 3000));
  }
  CHECK(a.server->stats().arena_recalls >= 1);
  // A asks again, behind B, and goes on writing.
  WriteAndCheck(*a.client, client_a, server_a, source_a, 200, 2000, token++);
  CHECK(a.client->stats().arena_asks >= 2);
  CHECK(a.server->open());
  CHECK(b.server->open());
}

TEST_CASE("a loan's key works on its own connection only: another QP that uses it loses its own",
          "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server, client, thief_side;
  Setup setup(config, Lending(2));
  server.hold_bulks = true;
  Pair victim = ConnectPair(setup, &server, &client, OnDemand());
  Source source(*setup.device);
  WriteAndCheck(*victim.client, client, server, source, 3, 2048, 1);
  const uint32_t key = ConnectionTestPeer::LentKey(*victim.server);
  const uint64_t addr = ConnectionTestPeer::LentAddress(*victim.server);
  REQUIRE(key != 0);
  // A raw peer connects to the same server and writes into the victim's loan with its key.
  setup.accepts->Use(setup.server_poller.get(), &thief_side);
  RawPeer thief;
  REQUIRE(thief.Connect(setup.device->selection().addr, setup.listener->port(), {}).ok());
  auto thief_server = setup.accepts->Next(kTimeout);
  REQUIRE(thief_server.ok());
  CHECK(thief.WriteRaw(addr, key, 64) == IBV_WC_REM_ACCESS_ERR);
  // The victim's payload is untouched, and its connection carries on.
  {
    absl::MutexLock lock(&server.mu);
    REQUIRE(server.bulks.size() == 1);
  }
  CHECK(std::string(reinterpret_cast<const char*>(addr), 2048) == Expected(3, 2048));
  WriteAndCheck(*victim.client, client, server, source, 4, 2048, 2);
  CHECK(victim.server->open());
  CHECK(victim.client->open());
}

}  // namespace

namespace {

// A raw peer connected to `setup`'s listener, whose server end lends its arena on demand.
struct RawClient {
  RawPeer peer;
  std::shared_ptr<Connection> server;
};

void ConnectRaw(Setup& setup, Recorder* server_side, RawClient* raw) {
  zrpc::transport::ListenerOptions listen;
  listen.connection = OnDemand();
  setup.Listen(listen);
  setup.accepts->Use(setup.server_poller.get(), server_side);
  REQUIRE(raw->peer.Connect(setup.device->selection().addr, setup.listener->port(), {}).ok());
  CHECK((raw->peer.server_hello().flags & zrpc::transport::kHelloArenaOnDemand) != 0);
  auto server = setup.accepts->Next(kTimeout);
  REQUIRE(server.ok());
  raw->server = *server;
}

// Sends one loan message as a kArena frame.
absl::Status SendArena(RawPeer& peer, zrpc::transport::ArenaOp op, uint32_t loan = 0) {
  zrpc::transport::ArenaMessage m;
  m.op = op;
  m.loan = loan;
  zrpc::transport::EncodeArenaMessage(m, peer.payload());
  return peer.Send(zrpc::transport::FrameKind::kArena, 0, zrpc::transport::ArenaMessage::kSize);
}

// Asks for a loan and waits until the answer arrives (arena_messages holds it).
void AskUntilLent(RawPeer& peer) {
  REQUIRE(SendArena(peer, zrpc::transport::ArenaOp::kAsk).ok());
  REQUIRE(Eventually(
      [&] {
        peer.Poll();
        return !peer.arena_messages.empty();
      },
      kTimeout));
}

// Waits for the server end to close, and returns why.
std::string ClosedWhy(Recorder& side) {
  REQUIRE(side.WaitFor([&] { return side.closed.has_value(); }, kTimeout));
  absl::MutexLock lock(&side.mu);
  return side.closed->ToString();
}

}  // namespace

TEST_CASE(
    "a peer that asks for a loan twice, or writes into an arena not lent, loses its connection",
    "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  Recorder asks_twice, writes_unlent;
  Setup setup(config, Lending(2));
  {
    RawClient raw;
    ConnectRaw(setup, &asks_twice, &raw);
    AskUntilLent(raw.peer);
    CHECK(raw.peer.arena_messages[0].op == zrpc::transport::ArenaOp::kLend);
    CHECK(raw.peer.arena_messages[0].size == kPiece);
    static_cast<void>(SendArena(raw.peer, zrpc::transport::ArenaOp::kAsk));
    const std::string why = ClosedWhy(asks_twice);
    INFO(why);
    CHECK(why.find("asked for an arena while holding one") != std::string::npos);
    // Its piece went back to the pool when its connection went.
    REQUIRE(Eventually([&] { return setup.server_poller->arena_pool()->lent() == 0; }, kTimeout));
  }
  {
    RawClient raw;
    ConnectRaw(setup, &writes_unlent, &raw);
    // Zero bytes: no key is checked (IB C9-88), so the WRITE reaches the server's connection,
    // which has lent nothing.
    static_cast<void>(raw.peer.WriteRaw(0, 0, 0, absl::Seconds(5), /*imm=*/0));
    const std::string why = ClosedWhy(writes_unlent);
    INFO(why);
    CHECK(why.find("wrote into an arena not lent to it") != std::string::npos);
  }
}

TEST_CASE(
    "a peer that keeps a recalled loan loses its connection, and the piece goes to the waiter",
    "[arena_loan]") {
  ZRPC_TEST_DEVICE(config);
  Recorder keeper, server, client;
  Setup setup(config, Lending(1));
  RawClient raw;
  ConnectRaw(setup, &keeper, &raw);
  AskUntilLent(raw.peer);
  // An honest client asks for the one piece: the keeper's loan is recalled and never returned.
  setup.accepts->Use(setup.server_poller.get(), &server);
  auto honest =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), &client, {}, kTimeout);
  REQUIRE(honest.ok());
  REQUIRE(setup.accepts->Next(kTimeout).ok());
  Source source(*setup.device);
  const absl::Time start = absl::Now();
  REQUIRE((*honest)->WriteBulk(source.Payload(5, 4000), 1).ok());
  REQUIRE(Eventually(
      [&] {
        raw.peer.Poll();
        return raw.peer.arena_messages.size() >= 2;
      },
      kTimeout));
  CHECK(raw.peer.arena_messages[1].op == zrpc::transport::ArenaOp::kRecall);
  const std::string why = ClosedWhy(keeper);
  INFO(why);
  CHECK(why.find("did not return its arena loan") != std::string::npos);
  REQUIRE(server.WaitFor([&] { return server.bulks.size() == 1; }, kTimeout));
  CHECK(absl::Now() - start >= Connection::kRecallGiveUp);
  absl::MutexLock lock(&server.mu);
  CHECK(server.bulks[0] == Expected(5, 4000));
}
