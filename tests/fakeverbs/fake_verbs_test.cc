// fakeverbs under zrpc's transport, on the host: the stand-in device is found like a real one,
// connections are made, refused and closed through rdma_cm, and SENDs, WRITEs with immediate,
// READs and their errors behave as fake_verbs.h says. What the counts rest on is checked here:
// a count of work on a stand-in that loses or invents work would mean nothing.
#include "tests/fakeverbs/fake_verbs.h"

#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
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

// librdmacm frees an id only once every event fetched for it is acked, so a thread may read a
// fetched event's id until it acks it (Poller::HandleCmEvents does). A stand-in that freed it at
// once let a server_domain_test run under ASan read a freed id (CI, 2026-11-29).
TEST_CASE("rdma_destroy_id waits for the ack of an event fetched for its id", "[fakeverbs]") {
  rdma_event_channel* channel = rdma_create_event_channel();
  REQUIRE(channel != nullptr);
  rdma_cm_id* id = nullptr;
  REQUIRE(rdma_create_id(channel, &id, reinterpret_cast<void*>(uintptr_t{42}), RDMA_PS_TCP) == 0);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(1);
  REQUIRE(inet_pton(AF_INET, zrpc::fakeverbs::kAddress, &dst.sin_addr) == 1);
  REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 1000) == 0);
  rdma_cm_event* event = nullptr;
  REQUIRE(rdma_get_cm_event(channel, &event) == 0);
  CHECK(event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    CHECK(rdma_destroy_id(id) == 0);
    destroyed = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  CHECK_FALSE(destroyed);
  CHECK(reinterpret_cast<uintptr_t>(event->id->context) == 42);  // still readable
  rdma_ack_cm_event(event);
  destroyer.join();
  CHECK(destroyed);
  rdma_destroy_event_channel(channel);
}

TEST_CASE("a listener destroyed with a connect request nobody fetched refuses the caller",
          "[fakeverbs]") {
  rdma_event_channel* server_channel = rdma_create_event_channel();
  rdma_event_channel* client_channel = rdma_create_event_channel();
  REQUIRE(server_channel != nullptr);
  REQUIRE(client_channel != nullptr);
  rdma_cm_id* listen_id = nullptr;
  REQUIRE(rdma_create_id(server_channel, &listen_id, nullptr, RDMA_PS_TCP) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, zrpc::fakeverbs::kAddress, &addr.sin_addr) == 1);
  REQUIRE(rdma_bind_addr(listen_id, reinterpret_cast<sockaddr*>(&addr)) == 0);
  REQUIRE(rdma_listen(listen_id, 4) == 0);
  addr.sin_port = rdma_get_src_port(listen_id);

  rdma_cm_id* client = nullptr;
  REQUIRE(rdma_create_id(client_channel, &client, nullptr, RDMA_PS_TCP) == 0);
  REQUIRE(rdma_resolve_addr(client, nullptr, reinterpret_cast<sockaddr*>(&addr), 1000) == 0);
  rdma_cm_event* event = nullptr;
  REQUIRE(rdma_get_cm_event(client_channel, &event) == 0);
  rdma_ack_cm_event(event);
  REQUIRE(rdma_resolve_route(client, 1000) == 0);
  REQUIRE(rdma_get_cm_event(client_channel, &event) == 0);
  rdma_ack_cm_event(event);
  Setup setup(FakeDevice());  // a device and its PD for the client's QP
  ibv_cq* cq = ibv_create_cq(setup.device->context(), 4, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(client, setup.device->pd(), &attr) == 0);
  rdma_conn_param param{};
  REQUIRE(rdma_connect(client, &param) == 0);

  REQUIRE(rdma_destroy_id(listen_id) == 0);  // the request is still queued, unfetched
  REQUIRE(rdma_get_cm_event(client_channel, &event) == 0);
  CHECK(event->event == RDMA_CM_EVENT_REJECTED);
  rdma_ack_cm_event(event);
  rdma_destroy_qp(client);
  CHECK(rdma_destroy_id(client) == 0);
  ibv_destroy_cq(cq);
  rdma_destroy_event_channel(client_channel);
  rdma_destroy_event_channel(server_channel);
}

}  // namespace
