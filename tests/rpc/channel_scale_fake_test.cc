// A channel's size chooses how it receives (ChannelOptions, kBySize in rpc/options.h): a few
// connections per poller keep their own receives and arenas, more share their poller's receive
// queue and borrow response arenas from its pool (transport/arena.h, "Loans"), so that a fan-out
// client does not register 388 KiB per connection. Over fakeverbs (type-2 windows, shared
// receive queues): on the host and under ASan. tests/rpc/shared_receive_queue_rpc_test runs a
// large channel over rxe.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "tests/eventually.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;
using zrpc::fakeverbs::FakeDevice;
using zrpc::testing::Served;
using zrpc::testing::TestGreeter;

// Larger than a 4 KiB slot holds, well within a 256 KiB arena: the reply is written into the
// channel's arena for its connection (its own, or a loan).
const std::string kLargeName(16 << 10, 'n');

zrpc::ChannelOptions Connections(int n) {
  zrpc::ChannelOptions options;
  options.connections = n;
  options.connect_timeout = zrpc::testing::kLong;
  return options;
}

// One large hello on each of the channel's connections in turn (calls go round robin), each
// answered whole.
void LargeHelloOnEach(Served& served, int connections) {
  Greeter::Stub stub(served.channel.get());
  for (int i = 0; i < connections; ++i) {
    HelloRequest request;
    request.set_name(kLargeName);
    HelloReply reply;
    const absl::Status s =
        stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(zrpc::testing::kLong));
    INFO(i << ": " << s);
    REQUIRE(s.ok());
    REQUIRE(reply.message() == "Hello, " + kLargeName);
  }
}

}  // namespace

TEST_CASE("a channel of a few connections per poller keeps its own receives and arenas",
          "[channel_scale]") {
  TestGreeter greeter;
  Served served{
      FakeDevice(), {&greeter}, {}, Connections(zrpc::ChannelOptions::kOwnReceivesPerPoller)};
  REQUIRE(served.channel->Connect(absl::Now() + zrpc::testing::kLong).ok());
  const zrpc::ChannelStats stats = served.channel->stats();
  CHECK(stats.shared_receives == 0);
  CHECK(stats.arena_pool == 0);
  const uint64_t binds = zrpc::fakeverbs::counters().binds;
  LargeHelloOnEach(served, zrpc::ChannelOptions::kOwnReceivesPerPoller);
  // The server lent each connection an arena for its request (a window bound each); the replies
  // went into the channel's own arenas (none).
  CHECK(zrpc::fakeverbs::counters().binds - binds == zrpc::ChannelOptions::kOwnReceivesPerPoller);
}

TEST_CASE("a channel of more connections per poller shares receives and borrows arenas",
          "[channel_scale]") {
  constexpr int kConnections = zrpc::ChannelOptions::kOwnReceivesPerPoller + 1;
  TestGreeter greeter;
  Served served{FakeDevice(), {&greeter}, {}, Connections(kConnections)};
  REQUIRE(served.channel->Connect(absl::Now() + zrpc::testing::kLong).ok());
  zrpc::ChannelStats stats = served.channel->stats();
  // Floors of 3 for 17 connections, a third more to grow into: below the 1,024 kept at least.
  if (zrpc::testing::RoomyLockedMemory()) {
    CHECK(stats.shared_receives == 1024);
    CHECK(stats.arena_pool == 64);
  }
  // Connected and idle: no arena registered for any of them.
  CHECK(stats.arenas_registered == 0);
  CHECK(stats.arenas_lent == 0);
  const uint64_t binds = zrpc::fakeverbs::counters().binds;
  LargeHelloOnEach(served, kConnections);
  // A window each way for each connection: the server's loan for the request, the channel's for
  // the reply.
  CHECK(zrpc::fakeverbs::counters().binds - binds == 2 * kConnections);
  stats = served.channel->stats();
  // Each connection borrowed a piece for its reply; none was short, so each kept its own.
  CHECK(stats.arenas_registered == kConnections);
  CHECK(stats.arenas_lent == kConnections);
  // And again: the loans stand, nothing more registered.
  LargeHelloOnEach(served, kConnections);
  CHECK(served.channel->stats().arenas_registered == kConnections);
}

TEST_CASE("a channel's pollers split its connections before choosing by size", "[channel_scale]") {
  // 32 connections over 2 pollers: 16 each, their own receives.
  zrpc::ChannelOptions options = Connections(2 * zrpc::ChannelOptions::kOwnReceivesPerPoller);
  options.pollers = 2;
  TestGreeter greeter;
  Served served{FakeDevice(), {&greeter}, {}, options};
  CHECK(served.channel->stats().shared_receives == 0);
  CHECK(served.channel->stats().arena_pool == 0);
}

TEST_CASE("a channel sized for 1,000 connections on one poller posts 4,000 shared receives",
          "[channel_scale]") {
  // Only what the channel makes at creation: no connection is made before a call or Connect.
  TestGreeter greeter;
  Served served{FakeDevice(), {&greeter}, {}, Connections(1000)};
  if (zrpc::testing::RoomyLockedMemory()) {
    CHECK(served.channel->stats().shared_receives == 4000);  // 1,000 floors of 3, and a third
    CHECK(served.channel->stats().arena_pool == 64);
  }
}

TEST_CASE("a channel's explicit receives and arenas are kept whatever its size",
          "[channel_scale]") {
  constexpr int kConnections = 24;
  SECTION("its own receives and arenas for every connection") {
    zrpc::ChannelOptions options = Connections(kConnections);
    options.shared_receive_queue = 0;
    options.arena_pool = 0;
    TestGreeter greeter;
    Served served{FakeDevice(), {&greeter}, {}, options};
    REQUIRE(served.channel->Connect(absl::Now() + zrpc::testing::kLong).ok());
    CHECK(served.channel->stats().shared_receives == 0);
    CHECK(served.channel->stats().arena_pool == 0);
    const uint64_t binds = zrpc::fakeverbs::counters().binds;
    LargeHelloOnEach(served, kConnections);
    CHECK(zrpc::fakeverbs::counters().binds - binds == kConnections);  // the server's loans only
  }
  SECTION("a pool far smaller than its connections: loans idle since the last look are recalled") {
    zrpc::ChannelOptions options = Connections(kConnections);
    options.arena_pool = 2;
    TestGreeter greeter;
    Served served{FakeDevice(), {&greeter}, {}, options};
    REQUIRE(served.channel->Connect(absl::Now() + zrpc::testing::kLong).ok());
    CHECK(served.channel->stats().arena_pool == 2);
    // Each connection's reply waits for a piece another gives back, one after another.
    LargeHelloOnEach(served, kConnections);
    LargeHelloOnEach(served, kConnections);
    // Two pieces served 24 connections' 48 replies: the loans went round.
    CHECK(served.channel->stats().arenas_registered == 2);
  }
  SECTION("a single connection may borrow too") {
    zrpc::ChannelOptions options = Connections(1);
    options.arena_pool = 1;
    TestGreeter greeter;
    Served served{FakeDevice(), {&greeter}, {}, options};
    CHECK(served.channel->stats().arenas_registered == 0);
    LargeHelloOnEach(served, 1);
    CHECK(served.channel->stats().arenas_registered == 1);
    CHECK(served.channel->stats().arenas_lent == 1);
  }
}

TEST_CASE("a server takes kBySize as its defaults", "[channel_scale]") {
  zrpc::ServerOptions server_options;
  server_options.shared_receive_queue = zrpc::kBySize;
  server_options.arena_pool = zrpc::kBySize;
  const uint64_t windows = zrpc::fakeverbs::counters().windows_alive;
  TestGreeter greeter;
  Served served{FakeDevice(), {&greeter}, server_options, Connections(1)};
  LargeHelloOnEach(served, 1);
  // The server lent an arena for the request (one window), the channel's own arena took the
  // reply (none).
  CHECK(zrpc::fakeverbs::counters().windows_alive == windows + 1);
}
