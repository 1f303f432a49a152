// The runtime over shared receive queues (RuntimeOptions::shared_receive_queue) on a real device
// (tag "rdma"): calls, bulk payloads both ways and keepalives on a server and a channel whose
// pollers share one receive queue each, held calls that do not starve the queue, and a server
// whose admission follows the windows its queues back.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/eventually.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::testing::Greeter;
using zrpc::testing::HelloBatch;
using zrpc::testing::HelloReply;
using zrpc::testing::Key;
using zrpc::testing::kLong;
using zrpc::testing::ObjectInfo;
using zrpc::testing::ObjectStore;
using zrpc::testing::Pattern;
using zrpc::testing::PutReply;
using zrpc::testing::Runtime;
using zrpc::testing::Within;

constexpr uint32_t kWindow = 16;
// The floor of each connection's elastic window (ConnectionOptions::idle_recv_credits, the
// default): what admission reserves of the three quarters of a shared queue that back floors
// (transport/receive_budget.h). So 16 receives back 4 floors, 8 back 2, 3 back 1.
constexpr uint32_t kFloor = 3;

zrpc::ServerOptions SharedServer(uint32_t receives) {
  zrpc::ServerOptions options;
  options.shared_receive_queue = receives;
  options.max_pollers = 0;  // the pollers asked for, none added (a case sets its own)
  options.listener.connection.recv_credits = kWindow;
  return options;
}

zrpc::ChannelOptions SharedChannel(uint32_t receives, int connections) {
  zrpc::ChannelOptions options;
  options.shared_receive_queue = receives;
  options.connection.recv_credits = kWindow;
  options.connections = connections;
  // Pings fall due often (what the held-calls case needs), and a 2-vCPU emulated guest under
  // load still answers them in time.
  options.keepalive_interval = absl::Milliseconds(100);
  options.keepalive_timeout = absl::Seconds(1);
  return options;
}

// A call from a channel the server refused until a place came free: tried again until it is
// admitted and answered, or kLong has passed (the last attempt's status).
absl::Status HelloOnceAdmitted(Greeter::Stub& stub, const std::string& name, HelloReply* reply) {
  absl::Status status;
  for (const absl::Time until = absl::Now() + kLong; absl::Now() < until;) {
    status = stub.SayHello(zrpc::testing::Named(name), reply, Within(kLong));
    if (status.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return status;
}

}  // namespace

TEST_CASE("calls and bulk payloads both ways run over shared receive queues on both sides") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // Two connections on each side's queue (the server's backs four windows, so that one address
  // may hold two), calls spread over both.
  Runtime rt(config, SharedServer(4 * kWindow), SharedChannel(2 * kWindow, 2));
  REQUIRE(rt.channel->Connect(absl::Now() + kLong).ok());
  REQUIRE(zrpc::testing::Eventually([&] { return rt.server->stats().connections_open == 2; }));
  Greeter::Stub greeter(rt.channel.get());
  ObjectStore::Stub store(rt.channel.get());

  // Many more calls in flight than the windows hold: the rest wait for credits.
  std::vector<std::string> names;
  for (int i = 0; i < 300; ++i) names.push_back(absl::StrCat("caller ", i));
  HelloBatch calls(greeter, names, kLong);
  REQUIRE(calls.Wait(kLong));
  for (size_t i = 0; i < calls.size(); ++i) {
    INFO("call " << i << ": " << calls.status(i));
    REQUIRE(calls.status(i).ok());
    CHECK(calls.reply(i).message() == "Hello, " + names[i]);
  }

  // A payload into the server's arena and one back into the channel's, and one too large for
  // either arena, pulled.
  for (const size_t size : {size_t{100} << 10, size_t{1} << 20}) {
    INFO("payload of " << size << " bytes");
    const std::string bytes = Pattern(size, static_cast<uint32_t>(size));
    PutReply put;
    REQUIRE(
        store
            .Put(Key("object"), zrpc::OutgoingBulk(bytes.data(), bytes.size()), &put, Within(kLong))
            .ok());
    CHECK(put.stored_bytes() == size);
    ObjectInfo info;
    zrpc::IncomingBulk got;
    REQUIRE(store.Get(Key("object"), &info, &got, Within(kLong)).ok());
    CHECK(got.view() == bytes);
  }
  const zrpc::ChannelStats stats = rt.channel->stats();
  CHECK(stats.connections_lost == 0);
}

TEST_CASE("a channel of many connections at default options shares receives and borrows arenas") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // More than kOwnReceivesPerPoller on its one poller: kBySize gives the channel a shared queue
  // and a pool of response arenas lent as the server writes answers' payloads.
  constexpr int kConnections = 24;
  zrpc::ChannelOptions channel_options;
  channel_options.connections = kConnections;
  Runtime rt(config, zrpc::ServerOptions(), channel_options);
  REQUIRE(rt.channel->Connect(absl::Now() + kLong).ok());
  zrpc::ChannelStats stats = rt.channel->stats();
  CHECK(stats.shared_receives == 1024);
  CHECK(stats.arena_pool == 64);
  CHECK(stats.arenas_registered == 0);  // connected, idle: no arena
  ObjectStore::Stub store(rt.channel.get());
  const std::string bytes = Pattern(size_t{100} << 10, 7);
  PutReply put;
  REQUIRE(
      store.Put(Key("object"), zrpc::OutgoingBulk(bytes.data(), bytes.size()), &put, Within(kLong))
          .ok());
  // One answer's payload on each connection (calls go round robin), each written through a
  // window over a piece of the channel's pool.
  for (int i = 0; i < kConnections; ++i) {
    INFO("get " << i);
    ObjectInfo info;
    zrpc::IncomingBulk got;
    REQUIRE(store.Get(Key("object"), &info, &got, Within(kLong)).ok());
    CHECK(got.view() == bytes);
  }
  stats = rt.channel->stats();
  CHECK(stats.arenas_registered == kConnections);
  CHECK(stats.arenas_lent == kConnections);
  CHECK(stats.connections_lost == 0);
}

// The server's handlers hold more calls than one window while keepalives fall due: the held
// requests keep the slots they arrived in, the queue is posted again at once, and the pings and
// the calls past the window still find receives.
TEST_CASE("a server holding calls past its window over a shared queue is not declared dead") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options = SharedServer(kWindow);
  server_options.handler_threads = kWindow + 4;
  Runtime rt(config, server_options, SharedChannel(kWindow, 1));
  Greeter::Stub stub(rt.channel.get());
  // "sleep:1000": ten keepalive intervals.
  HelloBatch calls(stub, std::vector<std::string>(kWindow + 8, "sleep:1000"), kLong);
  REQUIRE(calls.Wait(kLong));
  for (size_t i = 0; i < calls.size(); ++i) {
    INFO("call " << i << ": " << calls.status(i));
    CHECK(calls.status(i).ok());
  }
  CHECK(rt.channel->stats().connections_lost == 0);
}

TEST_CASE("a server with shared receive queues admits as many connections as their floors fit") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  REQUIRE(zrpc::transport::ConnectionOptions{}.idle_recv_credits == kFloor);
  // One poller whose queue backs four floors: the server takes four connections, and (every
  // client of this test sharing the guest's one address) two from one address.
  Runtime rt(config, SharedServer(16), SharedChannel(8, 2));
  Greeter::Stub stub(rt.channel.get());
  HelloReply reply;
  REQUIRE(stub.SayHello(zrpc::testing::Named("first"), &reply, Within(kLong)).ok());
  REQUIRE(rt.channel->Connect(absl::Now() + kLong).ok());

  zrpc::ChannelOptions third_options = SharedChannel(kFloor, 1);
  third_options.device = rt.config;
  third_options.connect_timeout = absl::Seconds(5);
  auto third = zrpc::CreateChannel(rt.target(), third_options);
  REQUIRE(third.ok());
  Greeter::Stub third_stub(third->get());
  const absl::Status refused =
      third_stub.SayHello(zrpc::testing::Named("third"), &reply, Within(absl::Seconds(10)));
  INFO(refused);
  CHECK(refused.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(refused.message(), "2 connections from that address"));

  // Once the first channel has gone, the third gets in.
  rt.channel.reset();
  const absl::Status admitted = HelloOnceAdmitted(third_stub, "third", &reply);
  INFO(admitted);
  CHECK(admitted.ok());
  CHECK(reply.message() == "Hello, third");
}

TEST_CASE("a shared receive queue too small for the floors it must back is refused at creation") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options = SharedServer(kFloor - 1);
  server_options.device = config;
  auto server = zrpc::Server::Create(server_options);
  REQUIRE_FALSE(server.ok());
  INFO(server.status());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(server.status().message(), "shared_receive_queue is 2"));

  // Three connections on one poller need three floors; two fit.
  zrpc::ChannelOptions channel_options = SharedChannel(8, 3);
  channel_options.device = config;
  auto channel = zrpc::CreateChannel("127.0.0.1:1", channel_options);
  REQUIRE_FALSE(channel.ok());
  INFO(channel.status());
  CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(channel.status().message(), "holds 3 of the channel's connections"));
  channel_options.connections = 2;
  CHECK(zrpc::CreateChannel("127.0.0.1:1", channel_options).ok());
}

// Before: a server's pollers were all made at Create (ServerOptions::pollers), so a server sized
// for many clients held every poller's queue and thread from the start, and a connection placed
// on a full poller was refused while another had room.
TEST_CASE("a server adds pollers as connections fill them, up to max_pollers, then refuses") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // Each poller's queue backs four floors: three pollers hold twelve connections.
  zrpc::ServerOptions server_options = SharedServer(16);
  server_options.pollers = 1;
  server_options.max_pollers = 3;
  // Every client has the guest's one address: it may take every place.
  server_options.listener.max_connections = 12;
  server_options.listener.max_connections_per_peer = 12;
  Runtime rt(config, server_options, SharedChannel(16, 4));
  CHECK(rt.server->stats().pollers == 1);
  REQUIRE(rt.channel->Connect(absl::Now() + kLong).ok());
  std::vector<std::unique_ptr<zrpc::ClientChannel>> channels;
  channels.push_back(std::move(rt.channel));
  auto add = [&](uint32_t receives, int connections) {
    zrpc::ChannelOptions options = SharedChannel(receives, connections);
    options.device = rt.config;
    options.connect_timeout = absl::Seconds(5);
    auto channel = zrpc::CreateChannel(rt.target(), options);
    REQUIRE(channel.ok());
    channels.push_back(*std::move(channel));
    return channels.back()->Connect(absl::Now() + kLong);
  };
  // The first poller is full with four: the fifth connection starts a second.
  CHECK(rt.server->stats().pollers == 1);
  absl::Status added = add(8, 1);
  INFO(added);
  REQUIRE(added.ok());
  CHECK(rt.server->stats().pollers == 2);
  // Seven more fill the second and start a third.
  added = add(32, 7);
  INFO(added);
  REQUIRE(added.ok());
  CHECK(rt.server->stats().pollers == 3);
  CHECK(rt.server->stats().connections_open == 12);
  CHECK(absl::StrContains(rt.server->PrometheusText(), "zrpc_server_pollers 3\n"));
  // Every connection serves calls, whichever poller holds it (a channel goes round robin).
  for (auto& channel : channels) {
    Greeter::Stub stub(channel.get());
    for (int i = 0; i < 8; ++i) {
      HelloReply reply;
      const absl::Status s = stub.SayHello(zrpc::testing::Named("many"), &reply, Within(kLong));
      INFO(s);
      REQUIRE(s.ok());
      CHECK(reply.message() == "Hello, many");
    }
  }
  // No fourth poller: the thirteenth connection is refused, saying why.
  zrpc::ChannelOptions last_options = SharedChannel(8, 1);
  last_options.device = rt.config;
  last_options.connect_timeout = absl::Seconds(5);
  auto last = zrpc::CreateChannel(rt.target(), last_options);
  REQUIRE(last.ok());
  Greeter::Stub last_stub(last->get());
  HelloReply reply;
  const absl::Status refused =
      last_stub.SayHello(zrpc::testing::Named("last"), &reply, Within(absl::Seconds(10)));
  INFO(refused);
  CHECK(refused.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(refused.message(), "server full: 12 connections"));
  CHECK(rt.server->stats().pollers == 3);
  // A poller's connections going leaves it running, with room the next connection takes.
  channels.front().reset();
  const absl::Status admitted = HelloOnceAdmitted(last_stub, "last", &reply);
  INFO(admitted);
  CHECK(admitted.ok());
  CHECK(rt.server->stats().pollers == 3);
}

TEST_CASE(
    "a server whose windows park holds more connections than its queues' floors, and every "
    "one serves calls") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // Two pollers whose queues back four floors each: eight connections hold floors, sixteen
  // more are admitted parked, and each of the twenty-four gets a floor when its client calls.
  zrpc::ServerOptions server_options = SharedServer(16);
  server_options.pollers = 1;
  server_options.max_pollers = 2;
  server_options.park_windows = true;
  server_options.listener.max_connections = 24;
  server_options.listener.max_connections_per_peer = 24;
  Runtime rt(config, server_options, SharedChannel(16, 1));
  // The fixture's channel is not used: the server's 24 connections are the three below.
  rt.channel.reset();
  REQUIRE(zrpc::testing::Eventually([&] { return rt.server->stats().connections_open == 0; }));
  auto channel_options = [&] {
    // A queue of 32 backs the 8 floors of a channel's 8 connections on its one poller.
    zrpc::ChannelOptions options = SharedChannel(32, 8);
    options.device = rt.config;
    options.connect_timeout = absl::Seconds(5);
    // Pings at the defaults: a parked connection's ping waits for a floor like a call.
    options.keepalive_interval = zrpc::ChannelOptions().keepalive_interval;
    options.keepalive_timeout = zrpc::ChannelOptions().keepalive_timeout;
    return options;
  };
  std::vector<std::unique_ptr<zrpc::ClientChannel>> channels;
  for (int i = 0; i < 3; ++i) {
    auto channel = zrpc::CreateChannel(rt.target(), channel_options());
    REQUIRE(channel.ok());
    const absl::Status connected = (*channel)->Connect(absl::Now() + kLong);
    INFO(connected);
    REQUIRE(connected.ok());
    channels.push_back(*std::move(channel));
  }
  CHECK(zrpc::testing::Eventually([&] { return rt.server->stats().connections_open == 24; }));
  const zrpc::ServerStats before = rt.server->stats();
  CHECK(before.pollers == 2);
  CHECK(before.parked_windows >= 16);
  // Every connection of every channel serves calls, from three threads at once (a channel goes
  // round robin over its connections, so each call of a round lands on another one).
  std::vector<std::thread> callers;
  std::atomic<int> failed{0};
  // While they call, windows park and open all the time, but never more than the 8 floors are
  // open: a window whose knock was heard stays parked until a floor is free for it.
  std::atomic<bool> calling{true};
  uint64_t fewest_parked = before.parked_windows;
  std::thread watcher([&] {
    while (calling.load()) {
      fewest_parked = std::min<uint64_t>(fewest_parked, rt.server->stats().parked_windows);
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  for (auto& channel : channels) {
    callers.emplace_back([&, stub = std::make_shared<Greeter::Stub>(channel.get())] {
      for (int i = 0; i < 48; ++i) {
        HelloReply reply;
        const absl::Status s =
            stub->SayHello(zrpc::testing::Named("parked"), &reply, Within(kLong));
        if (!s.ok() || reply.message() != "Hello, parked") {
          UNSCOPED_INFO(s);
          ++failed;
        }
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  calling = false;
  watcher.join();
  CHECK(failed.load() == 0);
  const zrpc::ServerStats after = rt.server->stats();
  std::printf(
      "24 connections over 8 floors: %llu knocks heard, %llu windows parked at the end, %llu "
      "at the fewest\n",
      static_cast<unsigned long long>(after.knocks_heard),
      static_cast<unsigned long long>(after.parked_windows),
      static_cast<unsigned long long>(fewest_parked));
  CHECK(fewest_parked >= 16);
  CHECK(after.knocks_heard >= 16);
  CHECK(after.connections_open == 24);
  CHECK(after.protocol_violations == 0);
  CHECK(absl::StrContains(rt.server->PrometheusText(), "zrpc_server_knocks_heard_total "));
}
