// Teardown with a shared receive queue (shared_receive_queue.h, "Teardown"): a connection whose
// queue pair takes its receives from a shared queue ends its drain only once the device has
// raised last-WQE-reached for it, after which no receive of the queue can complete for it (a
// device that then cleans a destroyed queue pair's unpolled completions, as mlx5 does, would
// otherwise take receives back behind the poller's count). Over fakeverbs, on the host: the
// stand-in raises the event when such a queue pair enters the error state, and can hold it back;
// rxe never raises it (Device::awaits_last_wqe is false there).
#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"

namespace {

using zrpc::testing::ConnectPair;
using zrpc::testing::Pair;
using zrpc::testing::Recorder;
using zrpc::testing::Setup;
using zrpc::transport::PollerOptions;

PollerOptions SharedQueue() {
  PollerOptions options;
  options.shared_receive_queue = 64;
  return options;
}

bool Closed(Recorder& r, absl::Duration within) {
  return r.WaitFor([&] { return r.closed.has_value(); }, within);  // under r.mu
}

// Holds the stand-in's last-WQE events for the life of the object.
struct HeldLastWqe {
  HeldLastWqe() { zrpc::fakeverbs::HoldLastWqeEvents(true); }
  ~HeldLastWqe() { zrpc::fakeverbs::HoldLastWqeEvents(false); }
};

TEST_CASE(
    "over a shared receive queue a connection's drain ends only after the device's last-WQE "
    "event; with receives of its own it waits for none",
    "[transport][srq]") {
  zrpc::fakeverbs::SetCapabilities({/*shared_receive_queues=*/true, /*windows=*/true,
                                    /*async_events=*/true});
  const zrpc::transport::DeviceConfig config = zrpc::fakeverbs::FakeDevice();

  SECTION("a shared receive queue on both sides: both wait, and close once it comes") {
    Recorder server, client;  // before the pollers, which report to them
    Setup setup(config, SharedQueue(), SharedQueue());
    REQUIRE(setup.device->awaits_last_wqe());
    Pair pair = ConnectPair(setup, &server, &client);
    const uint64_t before = setup.device->async_events().last_wqe;
    {
      HeldLastWqe held;
      pair.client->Close();
      // Both queue pairs are in error and their send queues drained; the device has not spoken.
      CHECK_FALSE(Closed(client, absl::Milliseconds(300)));
      CHECK_FALSE(Closed(server, absl::Milliseconds(10)));
      CHECK(absl::StrContains(pair.client->TryDebugString(), "awaiting the last-WQE event"));
    }
    CHECK(Closed(client, absl::Seconds(10)));
    CHECK(Closed(server, absl::Seconds(10)));
    CHECK(setup.device->async_events().last_wqe - before == 2);
    absl::MutexLock lock(&client.mu);
    CHECK(client.duplicate_closed == 0);
  }

  SECTION("receives of its own: no event comes, and none is awaited") {
    Recorder server, client;
    Setup setup(config, PollerOptions(), PollerOptions());
    Pair pair = ConnectPair(setup, &server, &client);
    const uint64_t before = setup.device->async_events().last_wqe;
    HeldLastWqe held;  // would keep one back, if any came
    pair.client->Close();
    CHECK(Closed(client, absl::Seconds(10)));
    CHECK(Closed(server, absl::Seconds(10)));
    CHECK(setup.device->async_events().last_wqe == before);
  }
}

}  // namespace
