// A channel of several connections makes a lost one again in the background (its restorer,
// rpc/client/channel.cc): after the wait that follows a loss, and only once the loss is over,
// never while the lost connection still drains. Over fakeverbs, which breaks one connection of
// many by when it was made (fakeverbs::HangUp): on the host and under ASan.
#include <catch2/catch.hpp>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/eventually.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/log_capture.h"
#include "tests/rpc/runtime_fixture.h"
#include "transport/poller.h"

namespace {

using zrpc::fakeverbs::FakeDevice;
using zrpc::fakeverbs::Flushes;
using zrpc::fakeverbs::HangUp;
using zrpc::testing::Served;
using zrpc::testing::TestGreeter;

constexpr absl::Duration kInitial = absl::Milliseconds(200);

zrpc::ChannelOptions ThreeConnections() {
  zrpc::ChannelOptions options;
  options.connections = 3;
  options.reconnect_backoff_initial = kInitial;  // a loss waits [100, 200] ms
  return options;
}

uint64_t Connects() { return zrpc::fakeverbs::counters().connects; }

// Every connection answers: as many Pings as connections, each on the one the channel picks.
void AllAnswer(Served& served) {
  zrpc::examples::Greeter::Stub stub(served.channel.get());
  for (int i = 0; i < 6; ++i) {
    google::protobuf::Empty request, reply;
    REQUIRE(stub.Ping(request, &reply, zrpc::CallOptions::Timeout(zrpc::testing::kLong)).ok());
  }
}

// A server and a channel of three connections, connected: the process's connections
// before + 1 to before + 3 (fakeverbs::HangUp's ordinals).
struct Connected {
  Connected() {
    REQUIRE(served.channel->Connect(absl::Now() + zrpc::testing::kLong).ok());
    REQUIRE(Connects() == before + 3);
  }
  TestGreeter greeter;
  const uint64_t before = Connects();
  Served served{FakeDevice(), {&greeter}, {}, ThreeConnections()};
};

}  // namespace

TEST_CASE("a connection lost while the others stay open is made again after the loss's wait",
          "[restore]") {
  Connected connected;
  Served& served = connected.served;
  const uint64_t before = connected.before;
  const absl::Time lost_at = absl::Now();
  REQUIRE(HangUp(before + 2));
  REQUIRE(zrpc::testing::Eventually([&] { return Connects() == before + 4; }));
  const absl::Duration took = absl::Now() - lost_at;
  INFO(absl::FormatDuration(took));
  CHECK(took >= kInitial / 2);
  CHECK(served.channel->stats().connections_lost == 1);
  AllAnswer(served);
  // Nothing more to restore: no further attempt.
  absl::SleepFor(kInitial * 2);
  CHECK(Connects() == before + 4);
}

// Before: the restorer made a subchannel's connection again as soon as it was not open, so one
// still draining its failure (here a device that lost its flushes: 3 s, until the poller's
// watchdog gives up) was replaced at once when another subchannel's loss woke the restorer, with
// no wait after the loss and the loss never noted (its OnClosed found another connection there).
TEST_CASE(
    "a connection still draining its failure is not made again until its drain ends, though "
    "another's loss wakes the restorer",
    "[restore]") {
  zrpc::testing::LogCapture log(zrpc::LogLevel::kWarning);  // the watchdog's warnings
  Connected connected;
  Served& served = connected.served;
  const uint64_t before = connected.before;
  const absl::Time lost_at = absl::Now();
  REQUIRE(HangUp(before + 1, Flushes::kLost));  // drains until the watchdog gives up
  REQUIRE(HangUp(before + 3));                  // closes at once: its loss wakes the restorer
  REQUIRE(zrpc::testing::Eventually([&] { return Connects() >= before + 4; }));
  // The draining one's turn comes only after its drain, and the wait after its loss.
  REQUIRE(zrpc::testing::Eventually([&] { return Connects() >= before + 5; }));
  const absl::Duration took = absl::Now() - lost_at;
  INFO(absl::FormatDuration(took));
  CHECK(took >= zrpc::transport::Poller::kDrainGiveUp + kInitial / 2);
  CHECK(Connects() == before + 5);
  CHECK(zrpc::testing::Eventually([&] { return served.channel->stats().connections_lost == 2; }));
  AllAnswer(served);
}
