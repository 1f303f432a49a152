// Channels that name the same ChannelOptions::poller_group share its pollers
// (rpc/client/poller_group.h): a client with a channel to each of many servers pays for pollers
// once. Over fakeverbs, on the host and under ASan.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "rpc/client/poller_group.h"
#include "tests/eventually.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;
using zrpc::fakeverbs::FakeDevice;
using zrpc::internal::PollerGroup;
using zrpc::testing::TestGreeter;

zrpc::ChannelOptions InGroup(const std::string& group) {
  zrpc::ChannelOptions options;
  options.device = FakeDevice();
  options.poller_group = group;
  options.connect_timeout = zrpc::testing::kLong;
  options.reconnect_backoff_initial = absl::Milliseconds(20);
  options.reconnect_backoff_max = absl::Milliseconds(100);
  return options;
}

// A started server over fakeverbs with `greeter`.
std::unique_ptr<zrpc::Server> Serve(TestGreeter& greeter, zrpc::ServerOptions options = {}) {
  options.device = FakeDevice();
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&greeter).ok());
  REQUIRE((*server)->Start().ok());
  return *std::move(server);
}

std::unique_ptr<zrpc::ClientChannel> Channel(const zrpc::Server& server,
                                             const zrpc::ChannelOptions& options) {
  auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(FakeDevice(), server.port()), options);
  INFO(channel.status());
  REQUIRE(channel.ok());
  return *std::move(channel);
}

void Hello(zrpc::ClientChannel& channel, const std::string& name) {
  Greeter::Stub stub(&channel);
  HelloRequest request;
  request.set_name(name);
  HelloReply reply;
  const absl::Status s =
      stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(zrpc::testing::kLong));
  INFO(s);
  REQUIRE(s.ok());
  CHECK(reply.message() == "Hello, " + name);
}

}  // namespace

TEST_CASE("channels to two servers in one group share its pollers, which stop with the last",
          "[poller_group]") {
  TestGreeter one_greeter, two_greeter;
  auto one = Serve(one_greeter);
  auto two = Serve(two_greeter);
  REQUIRE(PollerGroup::Find("pair") == nullptr);
  auto to_one = Channel(*one, InGroup("pair"));
  auto to_two = Channel(*two, InGroup("pair"));
  std::shared_ptr<PollerGroup> group = PollerGroup::Find("pair");
  REQUIRE(group != nullptr);
  CHECK(group->pollers().size() == 1);
  Hello(*to_one, "one");
  Hello(*to_two, "two");
  // A group is sized as a server is, whatever its channels' sizes (less under a tight
  // RLIMIT_MEMLOCK, process_limits_test), and its members see the same.
  CHECK(to_one->stats().shared_receives == to_two->stats().shared_receives);
  CHECK(to_one->stats().arena_pool == to_two->stats().arena_pool);
  if (zrpc::testing::RoomyLockedMemory()) {
    CHECK(to_one->stats().shared_receives == 4096);
    CHECK(to_one->stats().arena_pool == 64);
  }
  CHECK(group.use_count() == 3);  // this test's, and each channel's
  to_one.reset();
  CHECK(group.use_count() == 2);
  Hello(*to_two, "two again");
  to_two.reset();
  CHECK(group.use_count() == 1);
  // Only this test holds it now: the registry does not keep it alive.
  std::weak_ptr<PollerGroup> weak = group;
  group.reset();
  CHECK(weak.expired());
  CHECK(PollerGroup::Find("pair") == nullptr);
  // The name may be joined again: a new group.
  auto again = Channel(*one, InGroup("pair"));
  Hello(*again, "again");
  CHECK(PollerGroup::Find("pair") != nullptr);
}

TEST_CASE("a hundred channels of one connection each run on one group's one poller",
          "[poller_group]") {
  constexpr int kChannels = 100;
  TestGreeter greeter;
  auto server = Serve(greeter);
  const uint64_t queue_pairs = zrpc::fakeverbs::counters().qps_alive;
  std::vector<std::unique_ptr<zrpc::ClientChannel>> channels;
  for (int i = 0; i < kChannels; ++i) channels.push_back(Channel(*server, InGroup("hundred")));
  for (auto& channel : channels) {
    REQUIRE(channel->Connect(absl::Now() + zrpc::testing::kLong).ok());
  }
  for (int i = 0; i < kChannels; ++i) Hello(*channels[i], std::to_string(i));
  CHECK(zrpc::fakeverbs::counters().qps_alive == queue_pairs + 2 * kChannels);
  const std::shared_ptr<PollerGroup> group = PollerGroup::Find("hundred");
  REQUIRE(group != nullptr);
  CHECK(group->pollers().size() == 1);
  CHECK(server->stats().connections_open == kChannels);
}

TEST_CASE("a channel that would shape a group's pollers differently is refused, naming both",
          "[poller_group]") {
  TestGreeter greeter;
  auto server = Serve(greeter);
  auto first = Channel(*server, InGroup("shaped"));
  zrpc::ChannelOptions two_pollers = InGroup("shaped");
  two_pollers.pollers = 2;
  auto refused =
      zrpc::CreateChannel(zrpc::testing::TargetOf(FakeDevice(), server->port()), two_pollers);
  REQUIRE(!refused.ok());
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(refused.status().message(), "poller_group \"shaped\""));
  CHECK(absl::StrContains(refused.status().message(), "first channel asked for pollers = 1"));
  CHECK(absl::StrContains(refused.status().message(), "asks for pollers = 2"));
  zrpc::ChannelOptions no_pool = InGroup("shaped");
  no_pool.arena_pool = 0;
  auto refused_too =
      zrpc::CreateChannel(zrpc::testing::TargetOf(FakeDevice(), server->port()), no_pool);
  REQUIRE(!refused_too.ok());
  CHECK(absl::StrContains(refused_too.status().message(), "arena_pool = 0"));
  // The group is unharmed.
  Hello(*first, "first");
  // Another group may take any shape.
  two_pollers.poller_group = "other";
  auto other = Channel(*server, two_pollers);
  Hello(*other, "other");
}

TEST_CASE("a full group's connects fail and back off until a member leaves", "[poller_group]") {
  TestGreeter greeter;
  auto server = Serve(greeter);
  // Eight receives: three quarters back floors, two floors of 3: two connections at once.
  zrpc::ChannelOptions small = InGroup("small");
  small.shared_receive_queue = 8;
  auto first = Channel(*server, small);
  auto second = Channel(*server, small);
  auto third = Channel(*server, small);
  REQUIRE(first->Connect(absl::Now() + zrpc::testing::kLong).ok());
  REQUIRE(second->Connect(absl::Now() + zrpc::testing::kLong).ok());
  const absl::Status full = third->Connect(absl::Now() + absl::Milliseconds(300));
  INFO(full);
  CHECK(full.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(third->stats().connect_failures >= 2);  // tried again after its backoff
  // A call says why (the last attempt's reason, or this attempt's).
  {
    Greeter::Stub stub(third.get());
    HelloRequest request;
    request.set_name("refused");
    HelloReply reply;
    const absl::Status refused =
        stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(absl::Seconds(1)));
    INFO(refused);
    CHECK(absl::StrContains(refused.message(),
                            "every poller of ChannelOptions::poller_group \"small\" is full"));
  }
  first.reset();  // its connection's floor goes back to the queue
  REQUIRE(third->Connect(absl::Now() + zrpc::testing::kLong).ok());
  Hello(*third, "third");
  Hello(*second, "second");
}

// Before: a channel of a group let go of the group's pollers without waiting for them, and its
// connections' OnClosed (which ends their calls, through the channel's metrics and the calls'
// callbacks) could run on after the channel was freed.
TEST_CASE("a grouped channel destroyed with calls in flight ends them before it goes",
          "[poller_group]") {
  TestGreeter greeter;
  auto server = Serve(greeter);
  auto stays = Channel(*server, InGroup("teardown"));
  Hello(*stays, "before");
  for (int round = 0; round < 5; ++round) {
    auto goes = Channel(*server, InGroup("teardown"));
    Greeter::Stub stub(goes.get());
    constexpr int kCalls = 8;
    std::vector<HelloRequest> requests(kCalls);
    std::vector<HelloReply> replies(kCalls);
    std::atomic<int> ended{0};
    const int hellos = greeter.hellos.load();
    for (int i = 0; i < kCalls; ++i) {
      requests[i].set_name("sleep:200");
      stub.AsyncSayHello(requests[i], &replies[i], zrpc::CallOptions::Timeout(zrpc::testing::kLong),
                         [&](absl::Status) { ended.fetch_add(1); });
    }
    REQUIRE(zrpc::testing::Eventually([&] { return greeter.hellos.load() > hellos; }));
    goes.reset();
    // Every callback ran before the destructor returned.
    CHECK(ended.load() == kCalls);
  }
  Hello(*stays, "after");
}

// The threads of this process now (/proc/self/task).
int Threads() {
  int n = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (absl::StartsWith(line, "Threads:")) n = std::stoi(line.substr(8));
  }
  return n;
}

// Before: each channel ran a timer thread of its own, which woke every second for its keepalive
// pass: a hundred channels, a hundred threads and a hundred wake-ups a second.
TEST_CASE(
    "a group's channels share one timer thread: their deadlines fire, and one destroyed from "
    "another's deadline callback goes cleanly",
    "[poller_group]") {
  constexpr int kChannels = 100;
  TestGreeter greeter;
  auto server = Serve(greeter);
  std::vector<std::unique_ptr<zrpc::ClientChannel>> channels;
  channels.push_back(Channel(*server, InGroup("timers")));  // makes the group: poller and timer
  const int threads = Threads();
  for (int i = 1; i < kChannels; ++i) channels.push_back(Channel(*server, InGroup("timers")));
  INFO("threads before the other 99 channels: " << threads << ", after: " << Threads());
  // One connection each: no restorer either. (A few: a thread of an earlier case may end or
  // start meanwhile; a timer per channel would add 99.)
  CHECK(Threads() <= threads + 5);
  const std::shared_ptr<PollerGroup> group = PollerGroup::Find("timers");
  REQUIRE(group != nullptr);
  CHECK(group->timer().members() == kChannels);

  // Calls that outlive their deadlines on every other channel; the deadline callback of channel
  // 2k destroys channel 2k+1, whose own call is then cancelled (on the reaper's thread: the
  // callback runs on the group's timer).
  struct Ended {
    std::atomic<int> expired{0};
    std::atomic<int> cancelled{0};
    std::atomic<int> other{0};
  } ended;
  std::vector<HelloRequest> requests(kChannels);
  std::vector<HelloReply> replies(kChannels);
  for (int i = 0; i < kChannels; ++i) {
    REQUIRE(channels[i]->Connect(absl::Now() + zrpc::testing::kLong).ok());
  }
  std::vector<std::unique_ptr<Greeter::Stub>> stubs;
  for (int i = 0; i < kChannels; ++i) {
    stubs.push_back(std::make_unique<Greeter::Stub>(channels[i].get()));
  }
  // The long calls first: a short one's callback destroys its neighbour, which must have its
  // call out by then.
  std::vector<int> order;
  for (int i = 1; i < kChannels; i += 2) order.push_back(i);
  for (int i = 0; i < kChannels; i += 2) order.push_back(i);
  for (const int i : order) {
    requests[i].set_name("sleep:3000");
    const bool short_deadline = i % 2 == 0;
    stubs[i]->AsyncSayHello(
        requests[i], &replies[i],
        zrpc::CallOptions::Timeout(short_deadline ? absl::Milliseconds(200) : absl::Seconds(60)),
        [&, i](absl::Status s) {
          if (s.code() == absl::StatusCode::kDeadlineExceeded) {
            ended.expired.fetch_add(1);
            channels[i + 1].reset();  // from the group's timer thread
          } else if (s.code() == absl::StatusCode::kCancelled) {
            ended.cancelled.fetch_add(1);
          } else {
            ended.other.fetch_add(1);
          }
        });
  }
  REQUIRE(zrpc::testing::Eventually(
      [&] {
        return ended.expired.load() + ended.cancelled.load() + ended.other.load() == kChannels;
      },
      zrpc::testing::kLong));
  CHECK(ended.expired.load() == kChannels / 2);
  CHECK(ended.cancelled.load() == kChannels / 2);
  CHECK(ended.other.load() == 0);
  CHECK(zrpc::testing::Eventually([&] { return group->timer().members() == kChannels / 2; }));
  // The rest still call and time out as before.
  Hello(*channels[0], "still");
}
