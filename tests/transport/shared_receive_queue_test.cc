// A poller's shared receive queue (transport/shared_receive_queue.h) on the harness's device:
// traffic within credits and without receiver-not-ready, held messages that do not take the
// queue's receives, admission by the floors the queue backs, windows far larger than the queue
// growing from its budget and giving it back, and teardown during traffic that gives every slot
// back.

#include "transport/shared_receive_queue.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/eventually.h"
#include "tests/log_capture.h"
#include "tests/pattern.h"
#include "tests/rdma_device.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/port_counters.h"
#include "tests/transport/raw_peer.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"
#include "transport/poller.h"

namespace {

using namespace zrpc::transport;  // NOLINT: a test of this namespace
using zrpc::testing::ConnectPair;
using zrpc::testing::Eventually;
using zrpc::testing::Filled;
using zrpc::testing::kTimeout;
using zrpc::testing::Pair;
using zrpc::testing::PortCounter;
using zrpc::testing::Recorder;
using zrpc::testing::SendBytes;
using zrpc::testing::Setup;
using zrpc::testing::SlotsInUse;
using zrpc::testing::Window;

PollerOptions Shared(uint32_t receives, PollMode mode = PollMode::kEvent) {
  PollerOptions options;
  options.mode = mode;
  options.shared_receive_queue = receives;
  return options;
}

// Both port counters of receiver-not-ready, summed; -1 when the device has neither.
int64_t RnrCount(const DeviceSelection& selection) {
  const int64_t received = PortCounter(selection, "rcvd_rnr_err");
  const int64_t sent = PortCounter(selection, "send_rnr_err");
  if (received < 0 && sent < 0) return -1;
  return std::max<int64_t>(received, 0) + std::max<int64_t>(sent, 0);
}

// Sends `count` messages of `size` bytes numbered from `first` on `c`; false (and says why) on
// the first that fails.
bool SendNumbered(Connection& c, uint64_t first, uint64_t count, uint32_t size) {
  for (uint64_t i = first; i < first + count; ++i) {
    if (absl::Status s = SendBytes(c, Filled(size, i), i); !s.ok()) {
      std::printf("message %lu: %s\n", static_cast<unsigned long>(i), s.ToString().c_str());
      return false;
    }
  }
  return true;
}

// A connection through `setup`'s listener with `options`, its two handlers added to `handlers`
// (the server's, which keeps no bytes, also to `server_handlers`); with `send_first`, its client
// sends that many numbered messages before this side looks at the accept (a knock may then come
// before the server's end of the handshake is done).
Pair ConnectThroughListener(Setup& setup, const ConnectionOptions& options,
                            std::vector<std::unique_ptr<Recorder>>& handlers,
                            std::vector<Recorder*>& server_handlers, uint64_t send_first = 0) {
  handlers.push_back(std::make_unique<Recorder>());
  Recorder* server = handlers.back().get();
  server->keep_bytes = false;
  server_handlers.push_back(server);
  handlers.push_back(std::make_unique<Recorder>());
  setup.accepts->Use(setup.server_poller.get(), server);
  auto client =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), handlers.back().get(), options, kTimeout);
  INFO("client: " << client.status());
  REQUIRE(client.ok());
  for (uint64_t k = 0; k < send_first; ++k) {
    REQUIRE(SendBytes(**client, Filled(64, k), k).ok());
  }
  auto accepted = setup.accepts->Next(kTimeout);
  INFO("server: " << accepted.status());
  REQUIRE(accepted.ok());
  return Pair{*accepted, *client};
}

// A busy-polling server over a queue of 16 receives (4 floors of 3) whose windows park, and a
// busy-polling client poller, both over windows of 4: the parking cases' common ground.
struct Parking {
  explicit Parking(const DeviceConfig& config) : setup(config, ServerOptions(), ClientOptions()) {
    ListenerOptions listen;
    listen.connection = options;
    setup.Listen(listen);
  }
  static PollerOptions ServerOptions() {
    PollerOptions server = Shared(16, PollMode::kBusy);
    server.park_windows = true;
    return server;
  }
  static PollerOptions ClientOptions() {
    PollerOptions client;
    client.mode = PollMode::kBusy;
    return client;
  }

  // A connection through the listener (ConnectThroughListener).
  void Connect(uint64_t send_first = 0) {
    Pair pair = ConnectThroughListener(setup, options, handlers, server_handlers, send_first);
    clients.push_back(pair.client);
    servers.push_back(pair.server);
  }

  // Closes every client; the server's claims all come back.
  void CloseAll() {
    for (const auto& client : clients) client->Close();
    CHECK(Eventually([&] { return setup.server_poller->shared_receives_claimed() == 0; }));
  }

  const ConnectionOptions options = Window(4);
  std::vector<std::unique_ptr<Recorder>> handlers;  // before setup: outlive its connections
  Setup setup;
  std::vector<std::shared_ptr<Connection>> clients, servers;
  std::vector<Recorder*> server_handlers;
};

}  // namespace

TEST_CASE(
    "over shared receive queues 10,000 messages each way arrive in order, within credits, "
    "with no receiver-not-ready",
    "[rdma][transport][srq]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr uint64_t kMessages = 10000;
  constexpr uint32_t kSize = 100;
  // Each side's queue of 16 backs one connection's window, from its floor of 3 up to 7 (three
  // quarters of the queue back floors, a quarter growth: receive_budget.h).
  Recorder server_handler, client_handler;  // outlive the pollers, which report to them
  Setup setup(config, Shared(16), Shared(16, PollMode::kBusy));
  CHECK(setup.server_poller->shared_receives_posted() == 16);
  CHECK(setup.client_poller->shared_receives_posted() == 16);
  std::atomic<uint64_t> bad{0};
  auto checker = [&bad](std::atomic<uint64_t>* next) {
    return [&bad, next](const uint8_t* data, uint32_t size) {
      const std::string expected = Filled(kSize, next->fetch_add(1));
      if (size != kSize || std::memcmp(data, expected.data(), kSize) != 0) ++bad;
    };
  };
  std::atomic<uint64_t> server_next{0}, client_next{0};
  server_handler.keep_bytes = client_handler.keep_bytes = false;
  server_handler.on_message = checker(&server_next);
  client_handler.on_message = checker(&client_next);
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, Window(16), Window(16));

  const int64_t rnr_before = RnrCount(setup.device->selection());
  bool server_sent = false;
  std::thread from_server([&] { server_sent = SendNumbered(*pair.server, 0, kMessages, kSize); });
  CHECK(SendNumbered(*pair.client, 0, kMessages, kSize));
  from_server.join();
  CHECK(server_sent);
  REQUIRE(server_handler.WaitFor([&] { return server_handler.message_count == kMessages; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.message_count == kMessages; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.size() == kMessages; }));
  REQUIRE(server_handler.WaitFor([&] { return server_handler.done.size() == kMessages; }));
  CHECK(bad == 0);
  for (Recorder* r : {&server_handler, &client_handler}) {
    absl::MutexLock lock(&r->mu);
    CHECK(r->release_failures == 0);
    for (auto& [token, status] : r->done) {
      if (!status.ok()) FAIL("token " << token << ": " << status);
    }
  }
  for (Connection* c : {pair.client.get(), pair.server.get()}) {
    const ConnectionStats stats = c->stats();
    std::printf("stats: sent %lu, received %lu, credit frames %lu, max credits in use %u of %u\n",
                static_cast<unsigned long>(stats.messages_sent),
                static_cast<unsigned long>(stats.messages_received),
                static_cast<unsigned long>(stats.credit_frames_sent), stats.max_credits_in_use,
                stats.peer_max_recv_credits);
    CHECK(stats.messages_received == kMessages);
    CHECK(stats.max_credits_in_use <= stats.peer_max_recv_credits);
    CHECK(stats.recvs_posted == 0);  // the connection posted none of its own
  }
  // Every receive is posted again once the traffic has stopped.
  CHECK(Eventually([&] { return setup.server_poller->shared_receives_posted() == 16; }));
  CHECK(Eventually([&] { return setup.client_poller->shared_receives_posted() == 16; }));
  const int64_t rnr_after = RnrCount(setup.device->selection());
  std::printf("receiver-not-ready counters: %ld -> %ld\n", static_cast<long>(rnr_before),
              static_cast<long>(rnr_after));
  if (rnr_before < 0) {
    WARN("the device has no RNR counters in sysfs: only zrpc's own accounting was checked");
  } else {
    CHECK(rnr_after == rnr_before);
  }
}

TEST_CASE(
    "messages held until released keep their slots, and the shared queue is posted full "
    "meanwhile for the other connections",
    "[rdma][transport][srq]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr uint32_t kSize = 64;
  Recorder holder, holder_client, busy, busy_client;
  Setup setup(config, Shared(64));  // 48 back floors, 16 growth: room for a window of 16
  holder.hold = true;
  Pair held_pair = ConnectPair(setup, &holder, &holder_client, Window(16), Window(16));
  Pair busy_pair = ConnectPair(setup, &busy, &busy_client, Window(16), Window(16));
  const uint32_t slots_before = SlotsInUse(*setup.device);

  // The holder's peer spends every credit it may on data (the last is for credit frames).
  REQUIRE(SendNumbered(*held_pair.client, 0, 15, kSize));
  REQUIRE(holder.WaitFor([&] { return holder.held.size() == 15; }));
  // The 15 messages are in slots of their own now; the queue's receives were posted again.
  CHECK(Eventually([&] { return setup.server_poller->shared_receives_posted() == 64; }));
  CHECK(SlotsInUse(*setup.device) >= slots_before + 15);

  // The other connection's traffic goes on, many windows of it.
  REQUIRE(SendNumbered(*busy_pair.client, 0, 1000, kSize));
  REQUIRE(busy.WaitFor([&] { return busy.message_count == 1000; }));
  // The holder's peer is still held to its window: a 16th message waits for credits.
  uint64_t token = 15;
  REQUIRE(SendBytes(*held_pair.client, Filled(kSize, token), token).ok());
  absl::SleepFor(absl::Milliseconds(50));
  {
    absl::MutexLock lock(&holder.mu);
    CHECK(holder.message_count == 15);
  }

  // Released, the held messages give their credits back and the waiting one arrives.
  std::vector<uint64_t> handles;
  {
    absl::MutexLock lock(&holder.mu);
    handles.swap(holder.held);
  }
  for (uint64_t handle : handles) CHECK(held_pair.server->Release(handle).ok());
  REQUIRE(holder.WaitFor([&] { return holder.message_count == 16; }));
  // A handle released twice is refused at once (or, when the poller holds the domain, left to
  // it, which logs it): either way, no other message's slot goes with it.
  {
    zrpc::testing::LogCapture log(zrpc::LogLevel::kError);
    const absl::Status again = held_pair.server->Release(handles.front());
    if (again.ok()) {
      CHECK(Eventually(
          [&] { return log.Count(zrpc::LogLevel::kError, "transport", "released twice") == 1; }));
    } else {
      CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
    }
  }
  {
    absl::MutexLock lock(&holder.mu);
    REQUIRE(holder.held.size() == 1);
    CHECK(holder.messages.back() == Filled(kSize, 15));
    CHECK(held_pair.server->Release(holder.held.front()).ok());
    holder.held.clear();
  }
  CHECK(Eventually([&] { return setup.server_poller->shared_receives_posted() == 64; }));
}

// Floors of 16 here, to make each admission take a visible part of the queue.
ConnectionOptions Floor16() {
  ConnectionOptions options = Window(16);
  options.idle_recv_credits = 16;
  return options;
}

TEST_CASE("a poller admits connections while their floors fit its shared queue's receives",
          "[rdma][transport][srq]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  std::vector<std::unique_ptr<Recorder>> handlers;
  Setup setup(config, Shared(44));  // 33 back floors
  ListenerOptions listen;
  listen.connection = Floor16();
  setup.Listen(listen);
  auto connect = [&]() -> absl::StatusOr<std::shared_ptr<Connection>> {
    handlers.push_back(std::make_unique<Recorder>());
    Recorder* server = handlers.back().get();
    handlers.push_back(std::make_unique<Recorder>());
    setup.accepts->Use(setup.server_poller.get(), server);
    return Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                               setup.listener->port(), handlers.back().get(), Floor16(), kTimeout);
  };
  absl::StatusOr<std::shared_ptr<Connection>> first = connect();
  absl::StatusOr<std::shared_ptr<Connection>> second = connect();
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  std::vector<std::shared_ptr<Connection>> accepted;
  for (int i = 0; i < 2; ++i) {
    auto server = setup.accepts->Next(kTimeout);
    REQUIRE(server.ok());
    accepted.push_back(*server);
  }
  // 16 + 16 of the 33 that back floors taken: a third floor of 16 does not fit.
  absl::StatusOr<std::shared_ptr<Connection>> third = connect();
  INFO(third.status());
  REQUIRE_FALSE(third.ok());
  CHECK(absl::StrContains(third.status().message(), "shared receive queue"));
  absl::StatusOr<std::shared_ptr<Connection>> refusal = setup.accepts->Next(kTimeout);
  REQUIRE_FALSE(refusal.ok());
  CHECK(absl::StrContains(refusal.status().message(), "shared receive queue"));

  // Once a connection has gone, its window is the queue's again.
  (*first)->Close();
  accepted.front()->Close();
  CHECK(Eventually([&] {
    absl::MutexLock lock(&handlers[0]->mu);
    return handlers[0]->closed.has_value();
  }));
  accepted.front().reset();
  first->reset();
  // (The server's side of it may take a pass of its poller to go: until then, refused.)
  absl::StatusOr<std::shared_ptr<Connection>> fourth;
  absl::StatusOr<std::shared_ptr<Connection>> server;
  CHECK(Eventually([&] {
    fourth = connect();
    server = setup.accepts->Next(kTimeout);
    return fourth.ok();
  }));
  INFO(fourth.status());
  REQUIRE(fourth.ok());
  REQUIRE(server.ok());
  REQUIRE(SendBytes(**fourth, "after", 1).ok());
  Recorder* fourth_server = handlers[handlers.size() - 2].get();
  CHECK(fourth_server->WaitFor([&] { return fourth_server->message_count == 1; }));
}

TEST_CASE("connections closed during traffic on shared queues give every slot back",
          "[rdma][transport][srq]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kPairs = 3;
  constexpr uint32_t kSize = 200;
  std::vector<std::unique_ptr<Recorder>> handlers;
  auto setup = std::make_unique<Setup>(config, Shared(48), Shared(48, PollMode::kBusy));
  const uint32_t slots_at_start = SlotsInUse(*setup->device);
  std::vector<Pair> pairs;
  for (int i = 0; i < kPairs; ++i) {
    handlers.push_back(std::make_unique<Recorder>());
    handlers.push_back(std::make_unique<Recorder>());
    handlers[2 * i]->keep_bytes = handlers[2 * i + 1]->keep_bytes = false;
    handlers[2 * i]->hold = (i == 0);  // one server keeps what it gets, to the end
    pairs.push_back(ConnectPair(*setup, handlers[2 * i].get(), handlers[2 * i + 1].get(),
                                Window(16), Window(16)));
  }
  // Both ends of every pair send until their connection fails under them.
  std::atomic<bool> stop{false};
  std::vector<std::thread> senders;
  for (Pair& pair : pairs) {
    for (Connection* c : {pair.client.get(), pair.server.get()}) {
      senders.emplace_back([c, &stop] {
        for (uint64_t i = 0; !stop.load(); ++i) {
          auto buffer = c->AcquireSendBuffer();
          if (!buffer.ok()) {
            if (!c->open()) return;
            std::this_thread::yield();
            continue;
          }
          const std::string payload = Filled(kSize, i);
          std::memcpy(buffer->data, payload.data(), kSize);
          if (!c->Send(*buffer, kSize, i).ok()) {
            if (!c->open()) return;
            std::this_thread::yield();
          }
        }
      });
    }
  }
  absl::SleepFor(absl::Milliseconds(200));
  // Closed from both sides, mid-traffic.
  pairs[0].server->Close();
  pairs[1].client->Close();
  pairs[2].server->Close();
  stop.store(true);
  for (std::thread& t : senders) t.join();
  for (size_t i = 0; i < handlers.size(); ++i) {
    Recorder& handler = *handlers[i];
    if (handler.WaitFor([&] { return handler.closed.has_value(); }, kTimeout)) continue;
    // Which end of which pair never heard, and where its connection stands.
    const Connection& c = i % 2 == 0 ? *pairs[i / 2].server : *pairs[i / 2].client;
    const Connection& peer = i % 2 == 0 ? *pairs[i / 2].client : *pairs[i / 2].server;
    INFO("pair " << i / 2 << ", " << (i % 2 == 0 ? "server" : "client") << " end");
    INFO("it: " << c.DebugString());
    INFO("its peer: " << peer.DebugString());
    std::string pollers;
    for (Poller* poller : {setup->server_poller.get(), setup->client_poller.get()}) {
      absl::StrAppend(&pollers, poller == setup->server_poller.get() ? "server" : "; client",
                      " poller: loop ended ", poller->loop_ended(), ", passes ", poller->passes(),
                      ", receives posted ", poller->shared_receives_posted(), ", claimed ",
                      poller->shared_receives_claimed(), ", CQ entries free ",
                      poller->cq_entries_free());
    }
    INFO(pollers);
    FAIL("no OnClosed");
  }
  pairs.clear();  // with the messages the first server still holds (its Release is not needed)
  // Everything the connections and their queues held goes back once the pollers go.
  setup->server_poller.reset();
  setup->client_poller.reset();
  CHECK(slots_at_start == 2 * 48);  // the two queues' receives, on a fresh device
  CHECK(SlotsInUse(*setup->device) == 0);
}

TEST_CASE(
    "a hundred connections whose windows could claim eight times their poller's shared queue burst "
    "at once with no receiver-not-ready; their windows grow from its budget and give it back",
    "[rdma][transport][srq]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kConnections = 100;
  constexpr int kSenders = 4;
  constexpr uint64_t kBurst = 200;  // messages per connection, sent as fast as credits allow
  constexpr uint64_t kRun = 20;
  constexpr uint32_t kSize = 64;
  // The server's queue: three quarters back floors (every connection's 3, and more), a quarter
  // growth (receive_budget.h). Windows may reach 32 each: 3,200 together, against the queue's
  // 400 (100 for growth, low under 25 free, so windows shrink back soon) or 1,200.
  const uint32_t queue = GENERATE(400u, 1200u);
  INFO("queue " << queue);
  const ConnectionOptions options = Window(32);
  std::vector<std::unique_ptr<Recorder>> handlers;
  Setup setup(config, Shared(queue, PollMode::kBusy));
  ListenerOptions listen;
  listen.connection = options;
  setup.Listen(listen);
  std::vector<std::shared_ptr<Connection>> clients, servers;
  std::vector<Recorder*> server_handlers;
  for (int i = 0; i < kConnections; ++i) {
    INFO("connection " << i);
    Pair pair = ConnectThroughListener(setup, options, handlers, server_handlers);
    clients.push_back(pair.client);
    servers.push_back(pair.server);
  }
  CHECK(setup.server_poller->shared_receives_claimed() == kConnections * 3);

  const int64_t rnr_before = RnrCount(setup.device->selection());
  auto send_all = [&](uint64_t first, uint64_t count) {
    std::vector<std::thread> senders;
    std::atomic<int> failed{0};
    for (int t = 0; t < kSenders; ++t) {
      senders.emplace_back([&, t] {
        // Round-robin over this thread's connections, a run of kRun messages each per round:
        // more than a floor's credits, so that windows must grow for them, and all of them
        // with messages in flight at once.
        for (uint64_t m = first; m < first + count; m += kRun) {
          for (int c = t; c < kConnections; c += kSenders) {
            for (uint64_t k = m; k < std::min(m + kRun, first + count); ++k) {
              if (!SendBytes(*clients[c], Filled(kSize, k), k).ok()) ++failed;
            }
          }
        }
      });
    }
    for (std::thread& s : senders) s.join();
    return failed.load() == 0;
  };
  auto all_arrived = [&](uint64_t n) {
    for (Recorder* r : server_handlers) {
      if (!r->WaitFor([&] { return r->message_count == n; })) return false;
    }
    return true;
  };
  REQUIRE(send_all(0, kBurst));
  REQUIRE(all_arrived(kBurst));
  // Connections whose window grew past its floor, and what the windows claim together, which
  // must be exactly what the queue's budget says is claimed.
  auto windows = [&](uint32_t* grown) {
    uint32_t sum = 0;
    for (const auto& server : servers) {
      const ConnectionStats stats = server->stats();
      sum += stats.recv_window;
      if (grown != nullptr && stats.max_recv_window > options.idle_recv_credits) ++*grown;
    }
    return sum;
  };
  uint32_t grown = 0;
  const uint32_t windows_after_burst = windows(&grown);
  const uint32_t claimed_after_burst = setup.server_poller->shared_receives_claimed();
  // Then one message at a time on each: each release finds the peer holding most of its window
  // unused, and gives a receive back.
  for (uint64_t m = kBurst; m < kBurst + 40; ++m) {
    for (int c = 0; c < kConnections; ++c) {
      REQUIRE(SendBytes(*clients[c], Filled(kSize, m), m).ok());
    }
    REQUIRE(all_arrived(m + 1));
  }
  const uint32_t windows_after_quiet = windows(nullptr);
  const uint32_t claimed_after_quiet = setup.server_poller->shared_receives_claimed();
  const int64_t rnr_after = RnrCount(setup.device->selection());
  std::printf(
      "%d connections, queue %u: %u grew past their floor; claimed %u after the burst, %u after "
      "one at a time (floors: %d); receiver-not-ready %ld -> %ld\n",
      kConnections, queue, grown, claimed_after_burst, claimed_after_quiet, kConnections * 3,
      static_cast<long>(rnr_before), static_cast<long>(rnr_after));
  CHECK(grown > 0);
  CHECK(windows_after_burst == claimed_after_burst);
  CHECK(windows_after_quiet == claimed_after_quiet);
  CHECK(claimed_after_quiet <= kConnections * 5u);  // one at a time settles at F to F + 2
  if (rnr_before < 0) {
    WARN("the device has no RNR counters in sysfs: only zrpc's own accounting was checked");
  } else {
    CHECK(rnr_after == rnr_before);
  }
  for (const auto& client : clients) client->Close();
  CHECK(Eventually([&] { return setup.server_poller->shared_receives_claimed() == 0; }));
}

TEST_CASE(
    "a thousand connections on a poller whose shared queue holds 64 receives park and knock, and "
    "every message arrives with no receiver-not-ready",
    "[rdma][transport][srq][park]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kConnections = 1000;
  constexpr int kSenders = 4;
  constexpr uint64_t kMessages = 3;  // per connection: a window's worth needs a floor
  constexpr uint32_t kSize = 64;
  constexpr uint32_t kQueue = 64;  // 16 floors of 3 (and 16 receives of growth)
  PollerOptions server_options = Shared(kQueue, PollMode::kBusy);
  server_options.park_windows = true;
  PollerOptions client_options;
  client_options.mode = PollMode::kBusy;
  // Clients with a few receives of their own: 1,000 of them in one process.
  ConnectionOptions options = Window(4);
  std::vector<std::unique_ptr<Recorder>> handlers;  // before the pollers: they outlive them
  Setup setup(config, server_options, client_options);
  ListenerOptions listen;
  listen.connection = options;
  listen.max_connections_per_peer = kConnections;
  setup.Listen(listen);
  std::vector<std::shared_ptr<Connection>> clients, servers;
  std::vector<Recorder*> server_handlers;
  for (int i = 0; i < kConnections; ++i) {
    INFO("connection " << i);
    Pair pair = ConnectThroughListener(setup, options, handlers, server_handlers);
    clients.push_back(pair.client);
    servers.push_back(pair.server);
  }
  // The first 16 took the floors; the rest started parked.
  CHECK(setup.server_poller->shared_receives_claimed() == 16 * 3);
  CHECK(setup.server_poller->parked_windows() == kConnections - 16);

  const int64_t rnr_before = RnrCount(setup.device->selection());
  const absl::Time start = absl::Now();
  std::vector<std::thread> senders;
  std::atomic<int> failed{0};
  for (int t = 0; t < kSenders; ++t) {
    senders.emplace_back([&, t] {
      for (int c = t; c < kConnections; c += kSenders) {
        for (uint64_t k = 0; k < kMessages; ++k) {
          if (!SendBytes(*clients[c], Filled(kSize, k), k).ok()) ++failed;
        }
      }
    });
  }
  for (std::thread& s : senders) s.join();
  CHECK(failed.load() == 0);
  bool arrived = true;
  for (Recorder* r : server_handlers) {
    arrived = arrived && r->WaitFor([&] { return r->message_count == kMessages; });
  }
  CHECK(arrived);
  const absl::Duration took = absl::Now() - start;
  const int64_t rnr_after = RnrCount(setup.device->selection());
  uint64_t parks = 0, grants = 0, knocks = 0, answers = 0;
  uint32_t most_claimed = 0;
  for (const auto& server : servers) {
    const ConnectionStats stats = server->stats();
    parks += stats.parks;
    grants += stats.park_grants;
  }
  for (const auto& client : clients) {
    const ConnectionStats stats = client->stats();
    knocks += stats.knocks;
    answers += stats.parks_answered;
  }
  most_claimed = setup.server_poller->shared_receives_claimed();
  std::printf(
      "%d connections over a shared queue of %u: %llu messages in %s; %llu knocks (%llu heard, "
      "%llu foreign), %llu grants, %llu parks (%llu answered); claimed %u at the end; "
      "receiver-not-ready %ld -> %ld\n",
      kConnections, kQueue, static_cast<unsigned long long>(kConnections * kMessages),
      absl::FormatDuration(took).c_str(), static_cast<unsigned long long>(knocks),
      static_cast<unsigned long long>(setup.server_poller->knocks_heard()),
      static_cast<unsigned long long>(setup.server_poller->foreign_knocks()),
      static_cast<unsigned long long>(grants), static_cast<unsigned long long>(parks),
      static_cast<unsigned long long>(answers), most_claimed, static_cast<long>(rnr_before),
      static_cast<long>(rnr_after));
  // Every connection that started parked knocked and was opened; windows were taken back to
  // open them; no peer wrote a door not its own.
  CHECK(grants >= kConnections - 16);
  CHECK(knocks >= kConnections - 16);
  CHECK(parks > 0);
  CHECK(setup.server_poller->foreign_knocks() == 0);
  CHECK(most_claimed <= kQueue);
  if (rnr_before < 0) {
    WARN("the device has no RNR counters in sysfs: only zrpc's own accounting was checked");
  } else {
    CHECK(rnr_after == rnr_before);
  }
  for (const auto& client : clients) client->Close();
  CHECK(Eventually([&] { return setup.server_poller->shared_receives_claimed() == 0; }));
}

TEST_CASE(
    "a peer that writes another connection's door opens that window needlessly and harms no one; "
    "a write past the doors fails at its writer",
    "[rdma][transport][srq][park]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kHonest = 5;  // four take the floors, the fifth starts parked
  Parking parking(config);
  Setup& setup = parking.setup;
  auto& clients = parking.clients;
  auto& servers = parking.servers;
  auto& server_handlers = parking.server_handlers;
  for (int i = 0; i < kHonest; ++i) parking.Connect();
  REQUIRE(setup.server_poller->parked_windows() == 1);
  REQUIRE(servers.back()->stats().window_parked);
  // The hostile peer: admitted parked, its door next to the victim's (doors are handed out in
  // order on a fresh poller).
  parking.handlers.push_back(std::make_unique<Recorder>());
  setup.accepts->Use(setup.server_poller.get(), parking.handlers.back().get());
  zrpc::testing::RawPeer raw;
  REQUIRE(raw.Connect(setup.device->selection().addr, setup.listener->port(), {}).ok());
  auto raw_server = setup.accepts->Next(kTimeout);
  REQUIRE(raw_server.ok());
  REQUIRE(raw.server_hello().recv_credits == 0);  // parked from the start
  REQUIRE(raw.park_door().has_value());
  const zrpc::transport::ParkDoor door = *raw.park_door();
  const int64_t rnr_before = RnrCount(setup.device->selection());
  // Eight bytes of junk on the victim's door: a knock without its token.
  std::memset(raw.raw(), 0xa5, 8);
  CHECK(raw.WriteRaw(door.addr - 8, door.rkey, 8) == IBV_WC_SUCCESS);
  CHECK(Eventually([&] { return setup.server_poller->foreign_knocks() >= 1; }));
  // The victim's window opens (the idle ones park to make room) and its client, which never
  // knocked, takes the grant as one; everyone's messages arrive.
  CHECK(Eventually([&] { return !servers[kHonest - 1]->stats().window_parked; }));
  // Meanwhile the hostile peer keeps writing zeros on the victim's door, to hide its knocks: a
  // door is armed with a random value no peer knows, so every write is seen, never a knock lost.
  std::atomic<bool> spraying{true};
  std::thread spray([&] {
    std::memset(raw.raw(), 0, 8);
    while (spraying.load()) static_cast<void>(raw.WriteRaw(door.addr - 8, door.rkey, 8));
  });
  for (int i = 0; i < kHonest; ++i) {
    for (uint64_t k = 0; k < 8; ++k) REQUIRE(SendBytes(*clients[i], Filled(64, k), k).ok());
  }
  for (int i = 0; i < kHonest; ++i) {
    Recorder* r = server_handlers[i];
    CHECK(r->WaitFor([&] { return r->message_count == 8; }));
  }
  spraying = false;
  spray.join();
  CHECK(setup.server_poller->shared_receives_claimed() <= 16);
  // Past the doors: the doors' key covers nothing else, so the write fails with a remote access
  // error (the writer's queue pair is broken by it); the others carry on.
  CHECK(raw.WriteRaw(door.addr + (uint64_t{1} << 30), door.rkey, 8) == IBV_WC_REM_ACCESS_ERR);
  for (int i = 0; i < kHonest; ++i) {
    REQUIRE(SendBytes(*clients[i], Filled(64, 8), 8).ok());
    Recorder* r = server_handlers[i];
    CHECK(r->WaitFor([&] { return r->message_count == 9; }));
  }
  const int64_t rnr_after = RnrCount(setup.device->selection());
  if (rnr_before >= 0) CHECK(rnr_after == rnr_before);
  parking.CloseAll();
}

TEST_CASE(
    "parked clients that send the moment they connect are heard, and busy windows give their "
    "floors up after their turn",
    "[rdma][transport][srq][park]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kBusy = 4;    // take the four floors and never stop sending
  constexpr int kParked = 8;  // admitted parked; each sends at once
  constexpr uint64_t kEach = 4;
  Parking parking(config);
  auto& clients = parking.clients;
  auto& servers = parking.servers;
  auto& server_handlers = parking.server_handlers;
  for (int i = 0; i < kBusy; ++i) parking.Connect();
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0};
  std::vector<std::thread> busy;
  for (int i = 0; i < kBusy; ++i) {
    // The thread's own reference, taken here: `clients` grows below while it runs, and an element
    // read through the vector then may lie in storage its growth has freed (the SIGSEGV this test
    // hit once in CI).
    busy.emplace_back([&, client = clients[i]] {
      for (uint64_t k = 0; !stop.load(); ++k) {
        if (!SendBytes(*client, Filled(64, k), k).ok()) ++failed;
        absl::SleepFor(absl::Microseconds(500));  // a message every ~ms: never idle 10 ms
      }
    });
  }
  const absl::Time start = absl::Now();
  for (int i = 0; i < kParked; ++i) parking.Connect(kEach);
  bool arrived = true;
  for (int i = kBusy; i < kBusy + kParked; ++i) {
    Recorder* r = server_handlers[i];
    arrived = arrived && r->WaitFor([&] { return r->message_count == kEach; });
  }
  const absl::Duration took = absl::Now() - start;
  stop = true;
  for (std::thread& t : busy) t.join();
  CHECK(arrived);
  CHECK(failed.load() == 0);
  uint64_t parks = 0;
  for (int i = 0; i < kBusy; ++i) parks += servers[i]->stats().parks;
  std::printf(
      "%d parked clients served beside %d busy ones in %s; the busy ones parked %llu times\n",
      kParked, kBusy, absl::FormatDuration(took).c_str(), static_cast<unsigned long long>(parks));
  CHECK(parks > 0);  // busy windows were taken back once their turn was over
  parking.CloseAll();
}

// A server handler that, when told to, holds the poller's thread on the next message until the
// test lets it go: a poller that fell behind its arrivals.
class StallingRecorder : public Recorder {
 public:
  void OnMessage(Connection& c, const zrpc::transport::ReceivedMessage& m) override {
    {
      absl::MutexLock lock(&gate_mu_);
      if (stall_next_) {
        stall_next_ = false;
        stalled_ = true;
        gate_mu_.Await(absl::Condition(&go_));
        stalled_ = false;
      }
    }
    Recorder::OnMessage(c, m);
  }
  void StallNext() {
    absl::MutexLock lock(&gate_mu_);
    stall_next_ = true;
    go_ = false;
  }
  void Go() {
    absl::MutexLock lock(&gate_mu_);
    go_ = true;
  }
  // True once a message holds the poller, false if `timeout` passes first.
  bool WaitStalled(absl::Duration timeout) {
    absl::MutexLock lock(&gate_mu_);
    return gate_mu_.AwaitWithTimeout(absl::Condition(&stalled_), timeout);
  }

 private:
  absl::Mutex gate_mu_;
  bool stall_next_ ABSL_GUARDED_BY(gate_mu_) = false;
  bool go_ ABSL_GUARDED_BY(gate_mu_) = false;
  bool stalled_ ABSL_GUARDED_BY(gate_mu_) = false;
};

TEST_CASE(
    "the device reports a shared queue below its low-water mark while its poller is stalled; "
    "counted at once, and armed anew once the loop has posted the queue full again",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  PollerOptions server = Shared(32);
  server.shared_receive_low_water = 24;
  // Before the pollers: they outlive every report to these.
  StallingRecorder server_handler;
  Recorder client_handler;
  Setup setup(config, server);
  const uint64_t device_before = setup.device->async_events().shared_queue_low;
  ConnectionOptions options;
  // A floor of 16: 15 messages in flight before credits come back, and a credit frame at 8 owed.
  options.idle_recv_credits = 16;
  ListenerOptions listen;
  listen.connection = options;
  setup.Listen(listen);
  // However the test ends, a stalled poller goes on (or its Shutdown would wait for it).
  absl::Cleanup release = [&] { server_handler.Go(); };
  setup.accepts->Use(setup.server_poller.get(), &server_handler);
  auto client =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), &client_handler, options, kTimeout);
  INFO("client: " << client.status());
  REQUIRE(client.ok());
  auto accepted = setup.accepts->Next(kTimeout);
  REQUIRE(accepted.ok());
  Poller& poller = *setup.server_poller;
  CHECK(poller.shared_queue_low_water() == 24);
  for (uint64_t round = 1; round <= 2; ++round) {
    INFO("round " << round);
    // The device's count is the process's (every queue of the context): a report of an earlier
    // case's queue, raised before that queue went and read by the reader's thread only now, may
    // land in it. This poller's count is its own, and exact.
    const uint64_t device_at_round = setup.device->async_events().shared_queue_low;
    // The first message holds the poller; nine more take the device's posted receives from 32 to
    // 23, below the mark of 24, with nobody posting them again. The nine go once the first holds
    // it: sent together, several could arrive in the first's batch, be posted again before it
    // stalled, and leave the queue at the mark, not below (CI, 2026-12-07: no report in round 2).
    server_handler.StallNext();
    REQUIRE(SendNumbered(**client, 10 * (round - 1), 1, 64));
    REQUIRE(server_handler.WaitStalled(kTimeout));
    REQUIRE(SendNumbered(**client, 10 * (round - 1) + 1, 9, 64));
    const bool reported =
        Eventually([&] { return poller.shared_queue_low_reports() == round; }, absl::Seconds(10));
    // Printed before the checks, so that the log has the figures whatever the reporter does.
    std::printf("round %llu: poller reports %llu, device count %llu (%llu before the round)\n",
                static_cast<unsigned long long>(round),
                static_cast<unsigned long long>(poller.shared_queue_low_reports()),
                static_cast<unsigned long long>(setup.device->async_events().shared_queue_low),
                static_cast<unsigned long long>(device_at_round));
    std::fflush(stdout);
    CHECK(reported);
    // The loop marks the budget low on its next pass (it is the one stalled), and arms the
    // report anew once the queue is posted full.
    CHECK(setup.device->async_events().shared_queue_low >= device_at_round + 1);
    // The poller goes on: every message arrives, the queue is posted full, and the report is
    // armed anew (it fires once per arming: the next round's report shows it was).
    server_handler.Go();
    CHECK(server_handler.WaitFor([&] { return server_handler.message_count == 10 * round; }));
    CHECK(Eventually([&] { return !poller.shared_queue_low(); }, absl::Seconds(10)));
  }
  std::printf("shared queue low-water reports: poller %llu, device %llu\n",
              static_cast<unsigned long long>(setup.server_poller->shared_queue_low_reports()),
              static_cast<unsigned long long>(setup.device->async_events().shared_queue_low -
                                              device_before));
  (*client)->Close();
}
