// A poller's completion-queue entries (transport/completion_budget.h, poller.h "Capacity"):
// reserved per connection only for what it completes while idle, granted to sends as they go.
// Many connections sending bursts through small completion queues must each get every message
// through, in order, with connections waiting for entries and served when the holders give them
// back; the queue never overflows, even with its loop stopped while connections post (fakeverbs
// dies if it does; rxe would lose completions); every entry is back once the connections close.
// Registration is refused past what the queue can reserve, with the reason.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/eventually.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"
#include "transport/poller.h"
#include "transport/process_limits.h"
#ifdef ZRPC_OVER_FAKEVERBS
#include "tests/fakeverbs/fake_device.h"
#else
#include "tests/rdma_device.h"
#endif

namespace {

using zrpc::testing::Eventually;
using zrpc::testing::kTimeout;
using zrpc::testing::Recorder;
using zrpc::testing::SendBytes;
using zrpc::testing::Setup;
using zrpc::testing::Window;
using zrpc::transport::Connection;
using zrpc::transport::ConnectionOptions;
using zrpc::transport::CqEntriesReservedFor;
using zrpc::transport::DeviceConfig;
using zrpc::transport::PollerOptions;
using zrpc::transport::PollMode;

#ifdef ZRPC_OVER_FAKEVERBS
#define ZRPC_TEST_DEVICE(var) const DeviceConfig var = zrpc::fakeverbs::FakeDevice()
#else
#define ZRPC_TEST_DEVICE(var) ZRPC_REQUIRE_RDMA_DEVICE(var)
#endif

PollerOptions SmallCq(int entries, PollMode mode) {
  PollerOptions options;
  options.mode = mode;
  options.cq_size = entries;
  return options;
}

std::string Numbered(int connection, int i) {
  std::string s = absl::StrCat("c", connection, "-m", i, "-");
  s.resize(100, 'x');
  return s;
}

struct Connected {
  std::vector<std::unique_ptr<Recorder>> server_handlers;
  std::vector<std::unique_ptr<Recorder>> client_handlers;
  std::vector<std::shared_ptr<Connection>> servers;
  std::vector<std::shared_ptr<Connection>> clients;
};

// Connects `count` pairs through `setup`'s listener, each server connection with a handler of
// its own.
void ConnectMany(Setup& setup, int count, const ConnectionOptions& server_options,
                 const ConnectionOptions& options, Connected& out) {
  zrpc::transport::ListenerOptions listen;
  listen.connection = server_options;
  setup.Listen(listen);
  for (int i = 0; i < count; ++i) {
    out.server_handlers.push_back(std::make_unique<Recorder>());
    out.client_handlers.push_back(std::make_unique<Recorder>());
    setup.accepts->Use(setup.server_poller.get(), out.server_handlers.back().get());
    auto client = Connection::Connect(*setup.device, *setup.client_poller,
                                      setup.device->selection().addr, setup.listener->port(),
                                      out.client_handlers.back().get(), options, kTimeout);
    INFO("connection " << i << ": " << client.status());
    REQUIRE(client.ok());
    auto server = setup.accepts->Next(kTimeout);
    INFO("connection " << i << ": " << server.status());
    REQUIRE(server.ok());
    out.clients.push_back(*client);
    out.servers.push_back(*server);
  }
}

void CloseAll(Connected& c) {
  for (auto& client : c.clients) client->Close();
  for (size_t i = 0; i < c.clients.size(); ++i) {
    REQUIRE(
        c.client_handlers[i]->WaitFor([&] { return c.client_handlers[i]->closed.has_value(); }));
    REQUIRE(
        c.server_handlers[i]->WaitFor([&] { return c.server_handlers[i]->closed.has_value(); }));
  }
}

}  // namespace

TEST_CASE(
    "40 connections send bursts through a completion queue of 512 entries: every message "
    "arrives in order, connections wait for entries and are served, and every entry comes back",
    "[transport][cq]") {
  ZRPC_TEST_DEVICE(config);
  // The client's connections reserve 5 each (4 receives and the drain marker): 200 of the
  // client's 512 entries, leaving 312 for sends, 19 grants of 16, so most of the 40 must wait
  // for entries while others send. The server's reserve 33 (a window of 32) of its 2,048.
  constexpr int kConnections = 40;
  constexpr int kMessages = 200;
  const PollMode server_mode = GENERATE(PollMode::kEvent, PollMode::kBusy);
  INFO((server_mode == PollMode::kEvent ? "server poller in event mode" : "busy"));
  Setup setup(config, SmallCq(2048, server_mode), SmallCq(512, PollMode::kBusy));
  const int64_t server_free = setup.server_poller->cq_entries_free();
  const int64_t client_free = setup.client_poller->cq_entries_free();
  CHECK(client_free == 512);
  Connected c;
  ConnectMany(setup, kConnections, Window(32), Window(4), c);
  CHECK(setup.client_poller->cq_entries_free() ==
        client_free - kConnections * int64_t{CqEntriesReservedFor(Window(4), false)});
  // First with the client poller stopped: nothing reads its CQ, so every completion of what is
  // posted stays there. Within credits (31 of the server's 32 receives) each connection posts
  // all it can, 1,240 signalled sends in all (each reports), far past the 312 entries left:
  // only the budget keeps them from overrunning the queue (fakeverbs dies on an overrun, rxe
  // loses completions). Connections without a grant queue theirs until the loop serves them.
  constexpr int kStalled = 31;
  setup.client_poller->Stop();
  for (int i = 0; i < kStalled; ++i) {
    for (int k = 0; k < kConnections; ++k) {
      REQUIRE(SendBytes(*c.clients[k], Numbered(k, i), uint64_t(k) << 32 | i).ok());
    }
  }
  CHECK(setup.client_poller->cq_waits() > 0);
  REQUIRE(setup.client_poller->Start().ok());
  // Then round-robin from one thread: every connection has a burst queued at once.
  for (int i = kStalled; i < kMessages; ++i) {
    for (int k = 0; k < kConnections; ++k) {
      REQUIRE(SendBytes(*c.clients[k], Numbered(k, i), uint64_t(k) << 32 | i).ok());
    }
  }
  for (int k = 0; k < kConnections; ++k) {
    Recorder& r = *c.server_handlers[k];
    INFO("connection " << k << ": " << c.clients[k]->stats().waiting << " sends waiting, "
                       << c.clients[k]->stats().cq_entries_granted << " entries granted");
    REQUIRE(r.WaitFor([&] { return r.messages.size() == kMessages; }));
    absl::MutexLock lock(&r.mu);
    for (int i = 0; i < kMessages; ++i) REQUIRE(r.messages[i] == Numbered(k, i));
  }
  const uint64_t waits = setup.client_poller->cq_waits();
  INFO("client connections waited for entries " << waits << " times, server ones "
                                                << setup.server_poller->cq_waits());
  CHECK(waits > 0);  // 40 bursts over 19 grants
  for (int k = 0; k < kConnections; ++k) {
    CHECK(c.clients[k]->stats().cq_entries_granted <= 64);  // at most its send queue's depth
  }
  CloseAll(c);
  // Unregistered once drained: reservations and grants alike are back.
  CHECK(Eventually([&] { return setup.server_poller->cq_entries_free() == server_free; }));
  CHECK(Eventually([&] { return setup.client_poller->cq_entries_free() == client_free; }));
}

TEST_CASE(
    "a poller refuses a connection whose reservation its completion queue cannot take, with the "
    "reason, and admits what Capacity says",
    "[transport][cq]") {
  ZRPC_TEST_DEVICE(config);
  // 128 entries: 64 kept for sends, 64 for reservations of 9 each: 7 connections.
  Setup setup(config, SmallCq(128, PollMode::kEvent));
  const ConnectionOptions options = Window(8);
  REQUIRE(setup.server_poller->Capacity(options) == 7);
  Connected c;
  ConnectMany(setup, 7, options, options, c);
  setup.accepts->Use(setup.server_poller.get(), c.server_handlers.back().get());
  Recorder refused;
  auto eighth =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), &refused, options, kTimeout);
  INFO(eighth.status());
  REQUIRE(!eighth.ok());
  CHECK(absl::StrContains(eighth.status().message(),
                          "completion queue full: 9 entries needed, 63 of 128"));
  // The seven still work, each sending more than one grant's worth.
  for (int k = 0; k < 7; ++k) {
    for (int i = 0; i < 40; ++i) REQUIRE(SendBytes(*c.clients[k], Numbered(k, i), i).ok());
  }
  for (int k = 0; k < 7; ++k) {
    Recorder& r = *c.server_handlers[k];
    REQUIRE(r.WaitFor([&] { return r.messages.size() == 40; }));
  }
  CloseAll(c);
}

TEST_CASE("connections closed while others wait for entries give back exactly what they held, once",
          "[transport][cq]") {
  ZRPC_TEST_DEVICE(config);
  constexpr int kConnections = 40;
  constexpr int kStalled = 31;
  constexpr int kMessages = 100;
  Setup setup(config, SmallCq(2048, PollMode::kEvent), SmallCq(512, PollMode::kBusy));
  const int64_t client_free = setup.client_poller->cq_entries_free();
  Connected c;
  ConnectMany(setup, kConnections, Window(32), Window(4), c);
  // Holders and waiters, as in the first case: then every other one closes while nothing serves
  // the shortage, and its drain, its release and the passes it was owed all come after.
  setup.client_poller->Stop();
  for (int i = 0; i < kStalled; ++i) {
    for (int k = 0; k < kConnections; ++k) {
      REQUIRE(SendBytes(*c.clients[k], Numbered(k, i), i).ok());
    }
  }
  REQUIRE(setup.client_poller->cq_waits() > 0);
  for (int k = 1; k < kConnections; k += 2) c.clients[k]->Close();
  REQUIRE(setup.client_poller->Start().ok());
  for (int i = kStalled; i < kMessages; ++i) {
    for (int k = 0; k < kConnections; k += 2) {
      REQUIRE(SendBytes(*c.clients[k], Numbered(k, i), i).ok());
    }
  }
  for (int k = 0; k < kConnections; ++k) {
    Recorder& r = *c.server_handlers[k];
    if (k % 2 == 1) {
      REQUIRE(
          c.client_handlers[k]->WaitFor([&] { return c.client_handlers[k]->closed.has_value(); }));
      continue;
    }
    REQUIRE(r.WaitFor([&] { return r.messages.size() == kMessages; }));
    absl::MutexLock lock(&r.mu);
    for (int i = 0; i < kMessages; ++i) REQUIRE(r.messages[i] == Numbered(k, i));
  }
  // Each closed connection reported every send once (delivered or failed), then closed.
  for (int k = 1; k < kConnections; k += 2) {
    Recorder& h = *c.client_handlers[k];
    absl::MutexLock lock(&h.mu);
    CHECK(h.done.size() == kStalled);
    CHECK(h.duplicate_done == 0);
    CHECK(h.done_after_closed == 0);
  }
  CloseAll(c);
  CHECK(Eventually([&] { return setup.client_poller->cq_entries_free() == client_free; }));
  INFO("free entries " << setup.client_poller->cq_entries_free() << " of " << client_free);
  CHECK(setup.client_poller->cq_entries_free() == client_free);
}

// Deliverable 3's figure: with completion-queue entries granted only to sends in flight, a poller
// holds thousands of idle connections (each reserving its drain marker alone, with a shared
// receive queue), where reserving each one's send queue held 334 on rxe's 32,767 entries.
TEST_CASE("one poller holds 2,500 connections, each reserving one completion-queue entry",
          "[transport][cq]") {
  ZRPC_TEST_DEVICE(config);
  constexpr int kConnections = 2500;
  PollerOptions shared = SmallCq(32767, PollMode::kEvent);
  shared.shared_receive_queue = 10240;  // 7,680 back floors of 3: 2,560 connections' worth
  PollerOptions client_shared = shared;
  client_shared.mode = PollMode::kBusy;
  Setup setup(config, shared, client_shared);
  ConnectionOptions options = Window(4);
  options.arena_size = 0;  // idle connections: no bulk (the arena is deliverable 4's)
  const uint64_t capacity = setup.server_poller->Capacity(options);
  INFO("capacity " << capacity);
  REQUIRE(capacity >= kConnections);
  const int64_t server_free = setup.server_poller->cq_entries_free();
  zrpc::transport::ListenerOptions listen;
  listen.connection = options;
  listen.max_connections_per_peer = kConnections;  // every client shares the one address
  listen.accepts_per_second_per_peer = 1 << 20;
  listen.accept_burst_per_peer = 1 << 20;
  setup.Listen(listen);
  Recorder server_handler, client_handler;
  setup.accepts->Use(setup.server_poller.get(), &server_handler);
  std::vector<std::shared_ptr<Connection>> clients, servers;
  const uint64_t pinned_before = zrpc::transport::PinnedBytes();
  const absl::Time start = absl::Now();
  for (int i = 0; i < kConnections; ++i) {
    auto client =
        Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                            setup.listener->port(), &client_handler, options, kTimeout);
    INFO("connection " << i << ": " << client.status());
    REQUIRE(client.ok());
    clients.push_back(*client);
    auto server = setup.accepts->Next(kTimeout);
    REQUIRE(server.ok());
    servers.push_back(*server);
  }
  std::printf("%d connections in %s; server poller: %ld of %d entries free\n", kConnections,
              absl::FormatDuration(absl::Now() - start).c_str(),
              static_cast<long>(setup.server_poller->cq_entries_free()),
              setup.server_poller->cq_capacity());
  CHECK(setup.server_poller->cq_entries_free() == server_free - kConnections);
  // Both ends are in this process: what they pinned beyond the queues' receives (held from the
  // pollers' start) is their credit-frame slots, and the pool's chunks those came from.
  const uint64_t pinned = zrpc::transport::PinnedBytes() - pinned_before;
  std::printf("pinned (VmPin) for %d connections, both ends: %lu KiB, %.1f KiB per end\n",
              kConnections, static_cast<unsigned long>(pinned >> 10),
              pinned / 1024.0 / (2 * kConnections));
  // Every one of them still carries a message.
  for (int i = 0; i < kConnections; ++i) REQUIRE(SendBytes(*clients[i], Numbered(i, 0), i).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == kConnections; }));
  for (auto& client : clients) client->Close();
  REQUIRE(server_handler.WaitFor([&] { return server_handler.closed.has_value(); }));
  CHECK(Eventually([&] { return setup.server_poller->cq_entries_free() == server_free; }));
}
