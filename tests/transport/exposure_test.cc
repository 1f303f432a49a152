// Exposures (transport/exposures.h): a payload opened to one peer through a type-2 window bound
// to its queue pair, read by that peer, and closed by its SEND_WITH_INV. Raw-verbs peers check
// the keys' scope: another queue pair's READ under the key fails, a READ after the peer said done
// fails, the key of an earlier exposure of the same window fails, and the exposing connection is
// unaffected each time.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/eventually.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/raw_peer.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"
#include "transport/exposures.h"
#ifdef ZRPC_OVER_FAKEVERBS
#include "tests/fakeverbs/fake_device.h"
#define ZRPC_TEST_DEVICE(var) const DeviceConfig var = zrpc::fakeverbs::FakeDevice()
#else
#include "tests/rdma_device.h"
#define ZRPC_TEST_DEVICE(var) ZRPC_REQUIRE_RDMA_DEVICE(var)
#endif

namespace {

using zrpc::testing::ConnectPair;
using zrpc::testing::Eventually;
using zrpc::testing::kTimeout;
using zrpc::testing::Pair;
using zrpc::testing::RawPeer;
using zrpc::testing::Recorder;
using zrpc::testing::Setup;
using zrpc::transport::BulkSource;
using zrpc::transport::Connection;
using zrpc::transport::DeviceConfig;
using zrpc::transport::ExposedRange;
using zrpc::transport::ExposureKeys;
using zrpc::transport::FrameKind;
using zrpc::transport::MemoryRegion;
using zrpc::transport::RemoteRange;

constexpr uint32_t kSize = 16 * 1024;

// Memory to expose: kSize bytes, byte i = tag + i, registered for windows alone.
struct Exposable {
  std::vector<uint8_t> bytes;
  std::unique_ptr<MemoryRegion> region;
  Exposable(zrpc::transport::Device& device, uint8_t tag) : bytes(kSize) {
    for (uint32_t i = 0; i < kSize; ++i) bytes[i] = static_cast<uint8_t>(tag + i);
    auto r = device.RegisterForWindows(bytes.data(), bytes.size());
    INFO(r.status());
    REQUIRE(r.ok());
    region = *std::move(r);
  }
  ExposedRange range() const { return ExposedRange{bytes.data(), kSize, region.get()}; }
};

// What the test's exposing message says: the address and key of each range.
struct Told {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};
constexpr uint32_t kToldSize = 12;

Told Decode(const std::string& message) {
  Told t;
  REQUIRE(message.size() >= kToldSize);
  std::memcpy(&t.addr, message.data(), 8);
  std::memcpy(&t.rkey, message.data() + 8, 4);
  return t;
}

// Exposes `ranges` on `c` (reported with `token`) and sends a message naming the first.
ExposureKeys ExposeAndTell(Connection& c, std::vector<ExposedRange> ranges, uint64_t token) {
  absl::StatusOr<ExposureKeys> keys = c.Expose(ranges, token);
  INFO(keys.status());
  REQUIRE(keys.ok());
  REQUIRE(keys->count == static_cast<int>(ranges.size()));
  auto buffer = c.AcquireSendBuffer();
  REQUIRE(buffer.ok());
  const auto addr = reinterpret_cast<uint64_t>(ranges[0].data);
  std::memcpy(buffer->data, &addr, 8);
  std::memcpy(buffer->data + 8, &keys->rkeys[0], 4);
  const absl::Status sent = c.SendExposing(*keys, *buffer, kToldSize);
  INFO(sent);
  REQUIRE(sent.ok());
  return *keys;
}

// Sends a 4-byte message from `c` as a SEND_WITH_INV of `rkey`.
void SayDone(Connection& c, uint32_t rkey) {
  auto buffer = c.AcquireSendBuffer();
  REQUIRE(buffer.ok());
  std::memcpy(buffer->data, "done", 4);
  REQUIRE(c.SendInvalidating(*buffer, 4, rkey).ok());
}

// Reads kSize bytes at `told` on `c` and checks they are those of `expected`.
void ReadAndCheck(zrpc::transport::Device& device, Connection& c, Recorder& handler,
                  const Told& told, const Exposable& expected, uint64_t token) {
  std::vector<uint8_t> sink(kSize);
  auto region = device.RegisterMemory(sink.data(), sink.size());
  REQUIRE(region.ok());
  REQUIRE(c.ReadBulk(BulkSource{sink.data(), kSize, (*region)->lkey()},
                     RemoteRange{told.addr, told.rkey}, token)
              .ok());
  REQUIRE(handler.WaitFor([&] { return handler.done.count(token) > 0; }));
  {
    absl::MutexLock lock(&handler.mu);
    INFO(handler.done[token]);
    REQUIRE(handler.done[token].ok());
  }
  CHECK(sink == expected.bytes);
}

// A raw peer connected to `setup`'s listener, and its connection on the server.
struct RawClient {
  RawPeer peer;
  std::shared_ptr<Connection> server;
};

void ConnectRaw(Setup& setup, Recorder* server_side, RawClient* raw) {
  setup.accepts->Use(setup.server_poller.get(), server_side);
  RawPeer::Options options;
  options.reads = 1;
  REQUIRE(raw->peer.Connect(setup.device->selection().addr, setup.listener->port(), options).ok());
  auto server = setup.accepts->Next(kTimeout);
  REQUIRE(server.ok());
  raw->server = *server;
}

// Polls `peer` until it has received `frames` data frames; the last one's payload, decoded.
Told AwaitTold(RawPeer& peer, uint64_t frames) {
  REQUIRE(Eventually([&] {
    peer.Poll();
    return peer.data_frames >= frames;
  }));
  return Decode(std::string(peer.last_data.begin(), peer.last_data.end()));
}

bool ReportedOk(Recorder& r, uint64_t token) {
  absl::MutexLock lock(&r.mu);
  return r.done.count(token) > 0 && r.done[token].ok();
}

TEST_CASE("an exposed payload is read by its peer, and its SEND_WITH_INV ends the exposure",
          "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server, client;
  Setup setup(config);
  Pair pair = ConnectPair(setup, &server, &client);
  REQUIRE(setup.device->has_windows());
  Exposable memory(*setup.device, 5);

  // The exposure is reported done before the message that ended it is handed over.
  bool done_before_message = false;
  server.on_message = [&](const uint8_t*, uint32_t) {
    absl::MutexLock lock(&server.mu);
    done_before_message = server.done.count(7) > 0;
  };
  const ExposureKeys first = ExposeAndTell(*pair.server, {memory.range()}, 7);
  REQUIRE(client.WaitFor([&] { return client.messages.size() == 1; }));
  Told told;
  {
    absl::MutexLock lock(&client.mu);
    told = Decode(client.messages[0]);
  }
  CHECK(told.rkey == first.rkeys[0]);
  CHECK(pair.server->exposures_open() == 1);
  ReadAndCheck(*setup.device, *pair.client, client, told, memory, 11);
  SayDone(*pair.client, told.rkey);
  REQUIRE(server.WaitFor([&] { return server.messages.size() == 1; }));
  CHECK(ReportedOk(server, 7));
  CHECK(done_before_message);
  CHECK(pair.server->exposures_open() == 0);
  CHECK(pair.server->exposure_windows() == 1);  // kept for the next exposure

  // The next exposure binds the same window under a fresh key.
  const ExposureKeys second = ExposeAndTell(*pair.server, {memory.range()}, 8);
  CHECK((second.rkeys[0] >> 8) == (first.rkeys[0] >> 8));
  CHECK(second.rkeys[0] != first.rkeys[0]);
  REQUIRE(client.WaitFor([&] { return client.messages.size() == 2; }));
  {
    absl::MutexLock lock(&client.mu);
    told = Decode(client.messages[1]);
  }
  ReadAndCheck(*setup.device, *pair.client, client, told, memory, 12);
  SayDone(*pair.client, told.rkey);
  REQUIRE(server.WaitFor([&] { return server.messages.size() == 2; }));
  CHECK(ReportedOk(server, 8));

  // Two ranges: the peer invalidates one key, and the other dies with it (deallocated here).
  Exposable body(*setup.device, 9);
  const ExposureKeys both = ExposeAndTell(*pair.server, {memory.range(), body.range()}, 9);
  REQUIRE(client.WaitFor([&] { return client.messages.size() == 3; }));
  ReadAndCheck(*setup.device, *pair.client, client,
               Told{reinterpret_cast<uint64_t>(body.bytes.data()), both.rkeys[1]}, body, 13);
  SayDone(*pair.client, both.rkeys[1]);
  REQUIRE(server.WaitFor([&] { return server.messages.size() == 3; }));
  CHECK(ReportedOk(server, 9));
  CHECK(pair.server->exposures_open() == 0);
  CHECK(pair.server->exposure_windows() == 1);
  CHECK(pair.server->open());
  CHECK(pair.client->open());
  absl::MutexLock lock(&server.mu);
  CHECK(server.duplicate_done == 0);
}

TEST_CASE("a window's key opens nothing from another queue pair, after the peer's done, or stale",
          "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server_side;
  Setup setup(config);
  RawClient reader, thief;
  ConnectRaw(setup, &server_side, &reader);
  ConnectRaw(setup, &server_side, &thief);
  Exposable memory(*setup.device, 21);

  const ExposureKeys first = ExposeAndTell(*reader.server, {memory.range()}, 1);
  const Told told = AwaitTold(reader.peer, 1);
  CHECK(told.rkey == first.rkeys[0]);
  REQUIRE(reader.peer.ReadRaw(told.addr, told.rkey, kSize) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(reader.peer.read_bytes(), memory.bytes.data(), kSize) == 0);

  // Another queue pair of the same device, under the very key: refused, and only the thief pays.
  CHECK(thief.peer.ReadRaw(told.addr, told.rkey, kSize) == IBV_WC_REM_ACCESS_ERR);
  REQUIRE(reader.peer.ReadRaw(told.addr, told.rkey, kSize) == IBV_WC_SUCCESS);
  CHECK(reader.server->open());

  // The reader says done: the exposure is over, and the window is bound again under a new key.
  REQUIRE(reader.peer.Send(FrameKind::kData, 0, 4, kTimeout, told.rkey).ok());
  REQUIRE(Eventually([&] { return ReportedOk(server_side, 1); }));
  const ExposureKeys second = ExposeAndTell(*reader.server, {memory.range()}, 2);
  const Told again = AwaitTold(reader.peer, 2);
  CHECK((again.rkey >> 8) == (told.rkey >> 8));
  REQUIRE(reader.peer.ReadRaw(again.addr, again.rkey, kSize) == IBV_WC_SUCCESS);
  // The earlier exposure's key, on the same queue pair and the same window: refused.
  CHECK(reader.peer.ReadRaw(told.addr, told.rkey, kSize) == IBV_WC_REM_ACCESS_ERR);
  // That cost the reader its queue pair; it hangs up, and the exposure ends with the connection.
  reader.peer.Disconnect();
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&server_side.mu);
    return server_side.done.count(2) > 0;
  }));
  {
    absl::MutexLock lock(&server_side.mu);
    CHECK(!server_side.done[2].ok());
  }
  CHECK(reader.server->exposures_open() == 0);
  CHECK(second.id != first.id);

  // A READ after the peer's own done, with nothing bound since.
  RawClient late;
  ConnectRaw(setup, &server_side, &late);
  ExposeAndTell(*late.server, {memory.range()}, 3);
  const Told third = AwaitTold(late.peer, 1);
  REQUIRE(late.peer.ReadRaw(third.addr, third.rkey, kSize) == IBV_WC_SUCCESS);
  REQUIRE(late.peer.Send(FrameKind::kData, 0, 4, kTimeout, third.rkey).ok());
  REQUIRE(Eventually([&] { return ReportedOk(server_side, 3); }));
  CHECK(late.peer.ReadRaw(third.addr, third.rkey, kSize) == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("EndExposure and a closing connection end an exposure once, its key dead", "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  // Handlers before the pollers that call them: destroyed after them.
  Recorder server_side, server, client;
  Setup setup(config);
  RawClient reader;
  ConnectRaw(setup, &server_side, &reader);
  Exposable memory(*setup.device, 33);

  const ExposureKeys keys = ExposeAndTell(*reader.server, {memory.range()}, 5);
  const Told told = AwaitTold(reader.peer, 1);
  REQUIRE(reader.peer.ReadRaw(told.addr, told.rkey, kSize) == IBV_WC_SUCCESS);
  reader.server->EndExposure(keys.id);
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&server_side.mu);
    return server_side.done.count(5) > 0;
  }));
  {
    absl::MutexLock lock(&server_side.mu);
    CHECK(absl::IsCancelled(server_side.done[5]));
  }
  reader.server->EndExposure(keys.id);  // ended already: nothing more is reported
  CHECK(reader.server->exposures_open() == 0);
  CHECK(reader.server->exposure_windows() == 0);  // deallocated: only that kills a bound key
  CHECK(reader.peer.ReadRaw(told.addr, told.rkey, kSize) == IBV_WC_REM_ACCESS_ERR);

  // A connection that closes with exposures open reports each once, and keeps no window.
  Pair pair = ConnectPair(setup, &server, &client);
  ExposeAndTell(*pair.server, {memory.range()}, 6);
  Exposable other(*setup.device, 44);
  ExposeAndTell(*pair.server, {other.range(), memory.range()}, 7);
  REQUIRE(client.WaitFor([&] { return client.messages.size() == 2; }));
  CHECK(pair.server->exposures_open() == 2);
  pair.client->Close();
  REQUIRE(server.WaitFor([&] { return server.closed.has_value(); }));
  absl::MutexLock lock(&server.mu);
  CHECK(server.done.count(6) == 1);
  CHECK(server.done.count(7) == 1);
  CHECK(!server.done[6].ok());
  CHECK(server.duplicate_done == 0);
  CHECK(server.done_after_closed == 0);
  CHECK(pair.server->exposures_open() == 0);
  CHECK(pair.server->exposure_windows() == 0);
  absl::MutexLock lock2(&server_side.mu);
  CHECK(server_side.duplicate_done == 0);
}

TEST_CASE("a SEND_WITH_INV of a key it was not given costs the sender its connection",
          "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  Recorder server, client, hostile_side;
  Setup setup(config);
  Pair victim = ConnectPair(setup, &server, &client);
  Exposable memory(*setup.device, 55);
  const ExposureKeys keys = ExposeAndTell(*victim.server, {memory.range()}, 1);
  REQUIRE(client.WaitFor([&] { return client.messages.size() == 1; }));

  SECTION("a key of another connection's window") {
    RawClient hostile;
    ConnectRaw(setup, &hostile_side, &hostile);
    static_cast<void>(hostile.peer.Send(FrameKind::kData, 0, 4, kTimeout, keys.rkeys[0]));
    REQUIRE(Eventually([&] { return !hostile.server->open(); }));
    if (!setup.device->invalidation_checks_queue_pair()) {
      // rxe (Linux 6.1) invalidates a type-2 window from any queue pair that names its key
      // (Device::invalidation_checks_queue_pair): the victim's key is dead, its peer's READ fails
      // and costs the victim its connection, and the exposure is reported once, failed. What
      // the hostile peer needed was the whole key, whose low byte is random.
      std::vector<uint8_t> sink(kSize);
      auto region = setup.device->RegisterMemory(sink.data(), sink.size());
      REQUIRE(region.ok());
      REQUIRE(victim.client
                  ->ReadBulk(
                      BulkSource{sink.data(), kSize, (*region)->lkey()},
                      RemoteRange{reinterpret_cast<uint64_t>(memory.bytes.data()), keys.rkeys[0]},
                      9)
                  .ok());
      REQUIRE(server.WaitFor([&] { return server.done.count(1) > 0; }));
      absl::MutexLock lock(&server.mu);
      CHECK(!server.done[1].ok());
      CHECK(server.duplicate_done == 0);
      return;
    }
  }
  SECTION("a key of its own connection's that was never exposed") {
    RawClient hostile;
    ConnectRaw(setup, &hostile_side, &hostile);
    // An exposure of its own connection, whose key it guesses wrong in the low byte. (rxe
    // completes the SEND at the sender and fails the receiving queue pair; fakeverbs fails both.)
    const ExposureKeys own = ExposeAndTell(*hostile.server, {memory.range()}, 2);
    AwaitTold(hostile.peer, 1);
    static_cast<void>(hostile.peer.Send(FrameKind::kData, 0, 4, kTimeout, own.rkeys[0] ^ 0x5a));
    REQUIRE(Eventually([&] { return !hostile.server->open(); }));
  }
  // The victim's exposure is whole: its peer reads it and ends it as usual.
  ReadAndCheck(*setup.device, *victim.client, client,
               Told{reinterpret_cast<uint64_t>(memory.bytes.data()), keys.rkeys[0]}, memory, 9);
  SayDone(*victim.client, keys.rkeys[0]);
  REQUIRE(server.WaitFor([&] { return server.messages.size() == 1; }));
  CHECK(ReportedOk(server, 1));
  CHECK(victim.server->open());
  CHECK(victim.client->open());
}

}  // namespace
