// fakeverbs under zrpc's transport, on the host: the stand-in device is found like a real one,
// connections are made, refused and closed through rdma_cm, and SENDs, WRITEs with immediate,
// READs and their errors behave as fake_verbs.h says. What the counts rest on is checked here:
// a count of work on a stand-in that loses or invents work would mean nothing.
#include "tests/fakeverbs/fake_verbs.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"
#include "transport/device.h"
#include "transport/listener.h"
#include "transport/poller.h"

namespace {

using zrpc::fakeverbs::FakeDevice;

using zrpc::testing::ConnectPair;
using zrpc::testing::Pair;
using zrpc::testing::Recorder;
using zrpc::testing::SendBytes;
using zrpc::testing::Setup;
using zrpc::transport::Connection;
using zrpc::transport::DeviceConfig;

std::string Bytes(size_t size, char seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

TEST_CASE("the stand-in device is selected by its address, as RoCE v2, and by its name",
          "[fakeverbs]") {
  auto by_address = zrpc::transport::SelectDevice(FakeDevice());
  INFO(by_address.status());
  REQUIRE(by_address.ok());
  CHECK(by_address->device == "fake0");
  CHECK(by_address->gid_index == 1);
  CHECK(by_address->addr == zrpc::fakeverbs::kAddress);
  CHECK_FALSE(by_address->infiniband);
  DeviceConfig by_name;
  by_name.device = "fake0";
  by_name.port = 1;
  auto named = zrpc::transport::SelectDevice(by_name);
  INFO(named.status());
  REQUIRE(named.ok());
  CHECK(named->addr == zrpc::fakeverbs::kAddress);
}

TEST_CASE("messages of 0 B to a slot and a bulk payload cross a connection intact, both ways",
          "[fakeverbs]") {
  Recorder server_handler, client_handler;
  Setup setup(FakeDevice());
  Pair pair = ConnectPair(setup, &server_handler, &client_handler);
  const zrpc::fakeverbs::Counters before = zrpc::fakeverbs::counters();
  const std::vector<uint32_t> sizes = {0, 1, 64, pair.client->max_message_size()};
  for (size_t i = 0; i < sizes.size(); ++i) {
    REQUIRE(SendBytes(*pair.client, Bytes(sizes[i], 'a' + i), i).ok());
    REQUIRE(SendBytes(*pair.server, Bytes(sizes[i], 'A' + i), i).ok());
  }
  REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == sizes.size(); }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.messages.size() == sizes.size(); }));
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::MutexLock a(&server_handler.mu);
    CHECK(server_handler.messages[i] == Bytes(sizes[i], 'a' + i));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::MutexLock b(&client_handler.mu);
    CHECK(client_handler.messages[i] == Bytes(sizes[i], 'A' + i));
  }
  // A payload larger than a slot goes as a WRITE WITH IMMEDIATE into the peer's arena.
  const std::string payload = Bytes(100 << 10, 'p');
  auto region = setup.device->RegisterMemory(payload.data(), payload.size());
  REQUIRE(region.ok());
  REQUIRE(pair.client
              ->WriteBulk(
                  zrpc::transport::BulkSource{payload.data(), static_cast<uint32_t>(payload.size()),
                                              (*region)->lkey()},
                  77)
              .ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.bulks.size() == 1; }));
  {
    absl::MutexLock lock(&server_handler.mu);
    CHECK(server_handler.bulks[0] == payload);
  }
  const zrpc::fakeverbs::Counters after = zrpc::fakeverbs::counters();
  CHECK(after.sends - before.sends >= 2 * sizes.size());
  CHECK(after.writes - before.writes >= 1);
  CHECK(after.errors == before.errors);
  absl::MutexLock lock(&server_handler.mu);
  CHECK(server_handler.release_failures == 0);
}

TEST_CASE("a closed connection tells both ends, and nothing listening refuses a connect",
          "[fakeverbs]") {
  Recorder server_handler, client_handler;
  Setup setup(FakeDevice());
  Pair pair = ConnectPair(setup, &server_handler, &client_handler);
  pair.client->Close();
  REQUIRE(client_handler.WaitFor([&] { return client_handler.closed.has_value(); }));
  REQUIRE(server_handler.WaitFor([&] { return server_handler.closed.has_value(); }));
  {
    absl::MutexLock lock(&server_handler.mu);
    CHECK(server_handler.closed->code() == absl::StatusCode::kUnavailable);
  }
  const uint16_t port = setup.listener->port();
  setup.listener.reset();
  Recorder refused;
  auto none = Connection::Connect(*setup.device, *setup.client_poller, zrpc::fakeverbs::kAddress,
                                  port, &refused, {}, absl::Seconds(5));
  REQUIRE_FALSE(none.ok());
  CHECK(absl::StrContains(none.status().message(), "nothing listening"));
}

}  // namespace
