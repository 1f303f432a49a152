// Keepalives at two rates on a real device (tag "rdma"; rpc/client/keepalive.h): an idle
// connection pings once per idle_keepalive_interval, a busy one every keepalive_interval, and a
// server with thousands of idle connections keeps every one of them for several idle intervals
// while a busy connection beside them is checked as often as alone. Counts, not times: pings are
// counted by the server (keepalives_answered) and by the channels' own metrics
// ("zrpc.Keepalive/Ping"); their latency is printed beside its target.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "rpc/client/keepalive.h"
#include "tests/eventually.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HelloRequest;
using zrpc::testing::kLong;
using zrpc::testing::Runtime;
using zrpc::testing::Within;

constexpr char kPing[] = "zrpc.Keepalive/Ping";

zrpc::MethodMetricsSnapshot Pings(const zrpc::ClientChannel& channel) {
  for (zrpc::MethodMetricsSnapshot& m : channel.metrics().Snapshot()) {
    if (m.method == kPing) return m;
  }
  return {};
}

// Before: every connection that heard nothing for a pass pinged, idle or not: about 15 pings in
// 3 s at a 100 ms interval, where now an idle one sends 2 to 4 at a 1 s idle interval.
TEST_CASE("an idle connection pings once per idle interval, a busy one every interval") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ChannelOptions options;
  options.keepalive_interval = absl::Milliseconds(100);
  options.keepalive_timeout = absl::Seconds(1);
  options.idle_keepalive_interval = absl::Seconds(1);
  Runtime rt(config, {}, options);
  REQUIRE(rt.channel->Connect(absl::Now() + kLong).ok());

  absl::SleepFor(absl::Seconds(3));
  const uint64_t idle_pings = Pings(*rt.channel).started;
  INFO("idle: " << idle_pings << " pings in 3 s");
  // The first check anywhere in (0, 1 s], then every [0.75, 1] s plus the pass its answer takes.
  CHECK(idle_pings >= 2);
  CHECK(idle_pings <= 4);
  // A ping may be out at the snapshot: the server answers it within its round trip.
  CHECK(zrpc::testing::Eventually(
      [&] { return rt.server->stats().keepalives_answered >= idle_pings; }));

  // Busy: a call the server holds for 1.5 s. Nothing else arrives meanwhile, so every other pass
  // pings (the one after sees the answer): about 7.
  Greeter::Stub stub(rt.channel.get());
  HelloRequest request;
  request.set_name("sleep:1500");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply, Within(kLong)).ok());
  const uint64_t busy_pings = Pings(*rt.channel).started - idle_pings;
  INFO("busy: " << busy_pings << " pings in 1.5 s");
  CHECK(busy_pings >= 4);
  CHECK(busy_pings <= 9);
  CHECK(rt.channel->stats().connections_lost == 0);
  // Every ping answered OK (the last one may still be out at first).
  CHECK(zrpc::testing::Eventually([&] {
    const zrpc::MethodMetricsSnapshot pings = Pings(*rt.channel);
    return pings.finished[0] == pings.started;
  }));
}

// The scale case, sized for CI: kChannels channels of kPerChannel idle connections each (a
// channel holds at most 1,024), over shared receive queues with windows of up to 4 and no arenas on
// both sides (what an idle connection holds until issue 35's on-demand arenas land), pinging
// every 2 s for five idle intervals, and one busy connection beside them that the server holds
// in a call the whole time. Before, the idle ones pinged on every other pass: 1,000 pings a
// second. At a 2 s idle interval they would ping about 800 a second (2,000 / (1.75 s + the
// answer's pass)); a channel's cap of 256 idle checks a second holds them to 512.
TEST_CASE(
    "a server keeps two thousand idle connections through five idle intervals, each pinged at "
    "the idle rate, and a busy one beside them is checked every interval") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kChannels = 2;
  constexpr int kPerChannel = 1000;
  constexpr uint32_t kWindow = 4;
  constexpr absl::Duration kIdle = absl::Seconds(2);
  const absl::Duration kRun = 5 * kIdle;

  zrpc::ServerOptions server_options;
  // Closes a connection silent for 30 s (max_connection_idle: without it a silent connection is
  // probed, not closed, and the test could not tell): one whose channel never checks it (as when
  // every pass spent its idle checks on the same connections, the first 768 of each channel at this
  // rate) is closed while the second channel connects (30 to 70 s here) and the run goes on, and
  // counted lost. Not less: a channel's connection is checked about every 4 s here (1,000
  // idle connections, 256 checks a second), and in a saturated guest a second's checks took up
  // to 5 s (its 256 pings' sends each run rxe's send path on the timer thread), so a connection's
  // longest silence reached 19 s; at 12 s the server closed up to 29 of them in 4 runs of 16, and
  // the restorer's new connections loaded the guest further.
  server_options.max_connection_idle = absl::Seconds(30);
  // No advice: the clients keep their own 2 s, so the cap on idle checks binds (with the default
  // budget, 20 pings a second, the server would ask for 100 s).
  server_options.idle_keepalive_budget = 0;
  server_options.pollers = 2;
  server_options.max_pollers = 2;              // these two, none added
  server_options.shared_receive_queue = 8192;  // 2,048 floors of 3 per poller (3/4 of it)
  server_options.listener.connection.recv_credits = kWindow;
  server_options.listener.connection.arena_size = 0;
  // All clients share the guest's one address (the one admission option a test may change);
  // the server lowers it to half of what it holds, 2,048.
  server_options.listener.max_connections_per_peer = 4096;
  zrpc::ChannelOptions idle_options;
  idle_options.connections = kPerChannel;
  idle_options.shared_receive_queue = 4096;
  idle_options.connection.recv_credits = kWindow;
  idle_options.connection.arena_size = 0;
  idle_options.idle_keepalive_interval = kIdle;
  idle_options.connect_timeout = absl::Seconds(30);
  Runtime rt(config, server_options, {});  // its own channel: the busy one, default options

  std::vector<std::unique_ptr<zrpc::ClientChannel>> idle;
  const absl::Time connect_start = absl::Now();
  for (int i = 0; i < kChannels; ++i) {
    idle_options.device = config;
    auto channel = zrpc::CreateChannel(rt.target(), idle_options);
    REQUIRE(channel.ok());
    absl::Status connected = (*channel)->Connect(absl::Now() + absl::Minutes(3));
    INFO(connected);
    REQUIRE(connected.ok());
    idle.push_back(std::move(*channel));
  }
  const absl::Duration connect_took = absl::Now() - connect_start;
  REQUIRE(zrpc::testing::Eventually(
      [&] { return rt.server->stats().connections_open == kChannels * kPerChannel; }));

  // The busy connection: one call held by the server for the whole run.
  Greeter::Stub stub(rt.channel.get());
  REQUIRE(rt.channel->Connect(absl::Now() + kLong).ok());
  uint64_t idle_pings_before = 0;
  for (auto& channel : idle) idle_pings_before += Pings(*channel).started;
  const uint64_t busy_pings_before = Pings(*rt.channel).started;
  HelloRequest request;
  request.set_name(absl::StrCat("sleep:", absl::ToInt64Milliseconds(kRun)));
  HelloReply reply;
  absl::Status held = stub.SayHello(request, &reply, Within(kLong));
  INFO(held);
  CHECK(held.ok());

  uint64_t idle_pings = 0;
  uint64_t idle_failed = 0;
  zrpc::LatencySnapshot latency;
  for (auto& channel : idle) {
    CHECK(channel->stats().connections_lost == 0);
    const zrpc::MethodMetricsSnapshot pings = Pings(*channel);
    idle_pings += pings.started;
    idle_failed += pings.finished_total - pings.finished[0];
    latency.Add(pings.latency);
  }
  idle_pings -= idle_pings_before;
  const uint64_t busy_pings = Pings(*rt.channel).started - busy_pings_before;
  CHECK(rt.channel->stats().connections_lost == 0);
  CHECK(rt.server->stats().connections_idle_closed == 0);
  CHECK(rt.server->stats().connections_open == kChannels * kPerChannel + 1);

  // The cap binds here: 256 checks a second per channel, so 5,120 in the run (the
  // interval alone would allow about 8,000), never more. At least half of that: a pass lasts as
  // long as its 256 pings' sends take, so passes come late in a saturated guest (3,709 pings
  // once, passes of 1.4 s on average; none of the connections was left silent meanwhile, as
  // the checks above show).
  const double cap = kChannels * zrpc::internal::KeepaliveSchedule::kIdleChecksPerSecond *
                     absl::ToDoubleSeconds(kRun);
  const double one_pass = kChannels * zrpc::internal::KeepaliveSchedule::IdleChecksPerPass(
                                          idle_options.keepalive_interval);
  const double per_connection = static_cast<double>(idle_pings) / (kChannels * kPerChannel);
  // A pass every 300 ms (keepalive_interval) that heard nothing pings; every other one sees the
  // answer: about 16 in 10 s (16 measured). Half that, for passes slowed in a saturated guest.
  constexpr uint64_t kBusyPings = 8;
  const double p99 = latency.Percentile(0.99);
  const std::string figures = absl::StrCat(
      kChannels * kPerChannel, " idle connections (connected in ",
      absl::FormatDuration(connect_took), "): ", idle_pings, " pings in ",
      absl::FormatDuration(kRun), ", ", per_connection, " per connection (target: between ",
      0.5 * cap, " and ", cap + one_pass, " pings, the cap's); ping p99 ", p99 * 1e3,
      " ms (target: below half the 2 s keepalive_timeout); busy connection: ", busy_pings,
      " pings (target: at least ", kBusyPings, ")");
  INFO(figures);
  WARN(figures);
  CHECK(idle_pings >= 0.5 * cap);
  // One pass more than the run: the snapshot may come just after a pass.
  CHECK(idle_pings <= cap + one_pass);
  CHECK(idle_failed == 0);  // every ping that ended was answered
  CHECK(p99 < 1.0);
  CHECK(busy_pings >= kBusyPings);
  idle.clear();
}

}  // namespace
