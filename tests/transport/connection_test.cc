// The transport on a real device (tag "rdma"; tools/test runs it inside tools/softroce):
// device selection, connect/accept, SEND and bulk WRITE_WITH_IMM with content checked, credits
// under load with the NIC's RNR counters, handshake refusals, a peer killed mid-stream, and the
// event-mode poller sleeping and waking.
#include "transport/connection.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/eventually.h"
#include "tests/log_capture.h"
#include "tests/pattern.h"
#include "tests/pinned_memory.h"
#include "tests/rdma_device.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/port_counters.h"
#include "tests/transport/recorder.h"
#include "transport/cm_util.h"
#include "transport/device.h"
#include "transport/listener.h"
#include "transport/poller.h"
#include "transport/wire.h"

extern char** environ;

namespace {

using namespace zrpc::transport;  // NOLINT: a test of this namespace
using zrpc::testing::AcceptQueue;
using zrpc::testing::ConnectPair;
using zrpc::testing::DevicePollers;
using zrpc::testing::Fill;
using zrpc::testing::Filled;
using zrpc::testing::kTimeout;
using zrpc::testing::MovedCounters;
using zrpc::testing::OpenFileDescriptors;
using zrpc::testing::Pair;
using zrpc::testing::PortCounter;
using zrpc::testing::PortCounters;
using zrpc::testing::Recorder;
using zrpc::testing::SendBytes;
using zrpc::testing::Setup;
using zrpc::testing::SlotsInUse;

}  // namespace

TEST_CASE("zero-config selection picks the harness's device, RoCE v2 GID and address",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(harness);
  auto chosen = SelectDevice(DeviceConfig{});
  INFO(chosen.status());
  REQUIRE(chosen.ok());
  std::printf("zero-config: %s\n", chosen->ToString().c_str());
  CHECK(chosen->addr == harness.addr);
  if (!harness.device.empty()) CHECK(chosen->device == harness.device);
  if (harness.gid_index >= 0) CHECK(chosen->gid_index == harness.gid_index);
  // Forcing the address gives the same answer; forcing a GID index selects its address.
  DeviceConfig by_addr;
  by_addr.addr = harness.addr;
  auto forced = SelectDevice(by_addr);
  REQUIRE(forced.ok());
  CHECK(forced->ToString() == chosen->ToString());
  DeviceConfig by_gid;
  by_gid.device = chosen->device;
  by_gid.port = chosen->port;
  by_gid.gid_index = chosen->gid_index;
  auto forced_gid = SelectDevice(by_gid);
  REQUIRE(forced_gid.ok());
  CHECK(forced_gid->addr == chosen->addr);
  DeviceConfig missing;
  missing.device = "no_such_device0";
  CHECK(SelectDevice(missing).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "SENDs of 0 B, 1 B, max-inline and slot size arrive intact, with the inline size "
    "asked for and with one the device refuses",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // 1 MiB is past every device's inline limit: the request is halved until one is granted.
  const uint32_t requested = GENERATE(220u, 1u << 20);
  Recorder server_handler, client_handler;  // handlers outlive the pollers that call them
  Setup setup(config);
  ConnectionOptions options;
  options.max_inline = requested;
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);
  Connection& client = *pair.client;
  std::printf("connected to %s: asked for %u inline bytes, granted %u; max message %u\n",
              client.peer_address().c_str(), requested, client.max_inline(),
              client.max_message_size());
  REQUIRE(client.max_inline() >= 2 * FrameHeader::kSize);  // rxe grants 512 of 1 MiB
  if (requested > 220) CHECK(client.max_inline() < requested);
  std::vector<uint32_t> sizes = {0, 1, client.max_inline() - uint32_t{FrameHeader::kSize},
                                 client.max_inline() - uint32_t{FrameHeader::kSize} + 1,
                                 client.max_message_size()};
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("message of " << sizes[i] << " bytes");
    std::string payload = Filled(sizes[i], i + 1);
    REQUIRE(SendBytes(client, payload, i).ok());
    REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == i + 1; }));
    absl::MutexLock lock(&server_handler.mu);
    CHECK(server_handler.messages[i] == payload);
  }
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.size() == sizes.size(); }));
  absl::MutexLock lock(&client_handler.mu);
  for (auto& [token, status] : client_handler.done) CHECK(status.ok());
  CHECK(client_handler.duplicate_done == 0);
  // Too long for a SEND: refused before anything is posted.
  auto buffer = client.AcquireSendBuffer();
  REQUIRE(buffer.ok());
  CHECK(client.Send(*buffer, client.max_message_size() + 1, 99).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("bulk WRITE_WITH_IMM of 4 KiB, 1 MiB and a full arena lands intact",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler, s2, c2;
  Setup setup(config);
  ConnectionOptions server_options;
  server_options.arena_size = 2 << 20;
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, server_options);
  Connection& client = *pair.client;
  REQUIRE(client.peer_arena_size() == 2u << 20);

  std::vector<uint8_t> source(2 << 20);
  auto region = setup.device->RegisterMemory(source.data(), source.size());
  REQUIRE(region.ok());
  std::vector<uint32_t> sizes = {4096, 1 << 20, 2 << 20, 100, 2 << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("bulk payload of " << sizes[i] << " bytes");
    Fill(source.data(), sizes[i], 1000 + i);
    std::string expected(reinterpret_cast<char*>(source.data()), sizes[i]);
    REQUIRE(client.WriteBulk(BulkSource{source.data(), sizes[i], (*region)->lkey()}, i).ok());
    // The source must stay unchanged until the write is done.
    REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(i) == 1; }));
    REQUIRE(server_handler.WaitFor([&] { return server_handler.bulks.size() == i + 1; }));
    absl::MutexLock lock(&server_handler.mu);
    CHECK(server_handler.bulks[i].size() == sizes[i]);
    CHECK(server_handler.bulks[i] == expected);
  }
  {
    absl::MutexLock lock(&client_handler.mu);
    for (auto& [token, status] : client_handler.done) CHECK(status.ok());
  }
  // Bytes each way: the payloads, plus only the few frames that carried credits and releases
  // back (a frame header each), never a payload counted twice. The server's registered memory:
  // its own 2 MiB arena, receive slots and control slot.
  uint64_t payloads = 0;
  for (uint32_t size : sizes) payloads += size;
  const ConnectionStats sent = client.stats();
  const ConnectionStats received = pair.server->stats();
  INFO("client sent " << sent.bytes_sent << ", server received " << received.bytes_received
                      << ", payloads " << payloads);
  CHECK(sent.bytes_sent >= payloads);
  CHECK(sent.bytes_sent < payloads + 4096);
  // Equal once no credit frame is on its way between the two looks.
  CHECK(zrpc::testing::Eventually(
      [&] { return pair.server->stats().bytes_received == client.stats().bytes_sent; }));
  CHECK(received.bytes_sent < 4096);
  CHECK(received.registered_bytes >= (2u << 20) + setup.device->slots().slot_size());
  CHECK(received.registered_bytes < (2u << 20) + (256u << 10));
  // Larger than the peer's arena: refused, never truncated; empty: refused.
  auto too_big = client.WriteBulk(BulkSource{source.data(), (2u << 20) + 1, (*region)->lkey()}, 50);
  CHECK(too_big.code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_big.message().find("split") != absl::string_view::npos);
  CHECK(client.WriteBulk(BulkSource{source.data(), 0, (*region)->lkey()}, 51).code() ==
        absl::StatusCode::kInvalidArgument);
  // A peer without an arena refuses bulk payloads up front.
  ConnectionOptions no_arena;
  no_arena.arena_size = 0;
  Pair plain = ConnectPair(setup, &s2, &c2, no_arena);
  CHECK(plain.client->WriteBulk(BulkSource{source.data(), 64, (*region)->lkey()}, 1).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "a bulk write still waiting for arena space is withdrawn with its message, reported "
    "cancelled, and only then",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr uint32_t kArena = 64 * 1024;
  Recorder server_handler, client_handler;
  server_handler.hold_bulks = true;  // the arena stays full until the test releases
  Setup setup(config);
  ConnectionOptions options;
  options.arena_size = kArena;
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);
  Connection& client = *pair.client;
  std::vector<uint8_t> source(2 * kArena);
  Fill(source.data(), source.size(), 77);
  auto region = setup.device->RegisterMemory(source.data(), source.size());
  REQUIRE(region.ok());
  const uint32_t lkey = (*region)->lkey();

  REQUIRE(client.WriteBulk(BulkSource{source.data(), kArena, lkey}, 1).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.held_bulks.size() == 1; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(1) == 1; }));
  // The arena is full: this payload, its message and the message after them wait.
  REQUIRE(client.WriteBulk(BulkSource{source.data() + kArena, kArena, lkey}, 2).ok());
  REQUIRE(SendBytes(client, "refers to payload 2", 3).ok());
  REQUIRE(SendBytes(client, "independent", 4).ok());
  CHECK(client.stats().waiting == 3);

  client.WithdrawBulk(1);  // posted and done: nothing to take back, reported once already
  client.WithdrawBulk(3);  // a message, not a bulk write: nothing happens
  client.WithdrawBulk(2);
  client.WithdrawBulk(2);  // once: the second finds nothing
  // What waited behind them goes at once: the independent message, alone.
  REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == 1; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(4) == 1; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(2) == 1; }));
  CHECK(client.stats().waiting == 0);
  {
    absl::MutexLock lock(&server_handler.mu);
    CHECK(server_handler.messages[0] == "independent");
    CHECK(server_handler.bulks.size() == 1);
  }
  {
    absl::MutexLock lock(&client_handler.mu);
    CHECK(client_handler.done.at(2).code() == absl::StatusCode::kCancelled);  // withdrawn
    CHECK(client_handler.done.count(3) == 0);  // its message: gone with it, never reported
    CHECK(client_handler.duplicate_done == 0);
  }
  // The withdrawn source is the caller's again; the ring is intact for the next payload.
  Fill(source.data() + kArena, kArena, 78);
  {
    absl::MutexLock lock(&server_handler.mu);
    for (uint64_t handle : server_handler.held_bulks) CHECK(pair.server->Release(handle).ok());
    server_handler.held_bulks.clear();
  }
  REQUIRE(client.WriteBulk(BulkSource{source.data() + kArena, kArena, lkey}, 5).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.bulks.size() == 2; }));
  absl::MutexLock lock(&server_handler.mu);
  CHECK(server_handler.bulks[1] == Filled(kArena, 78));
  CHECK_FALSE(server_handler.closed.has_value());
}

TEST_CASE(
    "ReadBulk pulls a range the peer exposed, in pieces of the port's largest message, "
    "and a range no longer exposed fails the connection",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler;
  Setup setup(config);
  Pair pair = ConnectPair(setup, &server_handler, &client_handler);
  // More than two of rxe's 8 MiB READs, not a multiple of anything.
  const uint32_t size = 2 * setup.device->selection().max_msg_size + 12345;
  std::vector<uint8_t> exposed(size);
  Fill(exposed.data(), size, 404);
  auto remote = setup.device->RegisterForRemoteRead(exposed.data(), size);
  REQUIRE(remote.ok());
  std::vector<uint8_t> sink(size + 128, 0xEE);  // guard bytes after the sink
  auto local = setup.device->RegisterMemory(sink.data(), sink.size());
  REQUIRE(local.ok());
  const RemoteRange range{reinterpret_cast<uintptr_t>(exposed.data()), (*remote)->rkey()};
  const auto counters_before = PortCounters(setup.device->selection());
  REQUIRE(pair.client->ReadBulk(BulkSource{sink.data(), size, (*local)->lkey()}, range, 7).ok());
  const bool read_done = client_handler.WaitFor([&] { return client_handler.done.count(7) == 1; });
  if (!read_done) {
    // Once in CI (2026-11-27) this READ neither completed nor failed in 60 s, and never since in
    // about 150 runs. What the device and both ends saw, for the next time.
    UNSCOPED_INFO("client: " << pair.client->DebugString());
    UNSCOPED_INFO("server: " << pair.server->DebugString());
    UNSCOPED_INFO("port counters: " << MovedCounters(setup.device->selection(), counters_before));
  }
  REQUIRE(read_done);
  {
    absl::MutexLock lock(&client_handler.mu);
    CHECK(client_handler.done.size() == 1);  // one report for all the pieces
    CHECK(client_handler.done[7].ok());
  }
  CHECK(std::memcmp(sink.data(), exposed.data(), size) == 0);
  CHECK(std::count(sink.begin() + size, sink.end(), 0xEE) == 128);
  CHECK(pair.server->stats().messages_received == 0);  // the peer's application saw nothing
  CHECK(pair.client->ReadBulk(BulkSource{sink.data(), 0, (*local)->lkey()}, range, 8).code() ==
        absl::StatusCode::kInvalidArgument);

  // Several ranges as one transfer: the tail, an empty part, then the head, each into its own
  // sink (in one buffer here, swapped), and one report after the last.
  std::fill(sink.begin(), sink.end(), 0xEE);
  const uint32_t head = 1000;
  const uint32_t tail = size - head;
  const Connection::ReadPart parts[] = {
      {BulkSource{sink.data(), tail, (*local)->lkey()}, RemoteRange{range.addr + head, range.rkey}},
      {BulkSource{sink.data() + tail, 0, (*local)->lkey()}, range},
      {BulkSource{sink.data() + tail, head, (*local)->lkey()}, range},
  };
  REQUIRE(pair.client->ReadBulk(absl::MakeConstSpan(parts), 10).ok());
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(10) == 1; }));
  {
    absl::MutexLock lock(&client_handler.mu);
    CHECK(client_handler.done.size() == 2);
    CHECK(client_handler.done[10].ok());
  }
  CHECK(std::memcmp(sink.data(), exposed.data() + head, tail) == 0);
  CHECK(std::memcmp(sink.data() + tail, exposed.data(), head) == 0);
  CHECK(std::count(sink.begin() + size, sink.end(), 0xEE) == 128);
  const Connection::ReadPart empty[] = {{BulkSource{sink.data(), 0, (*local)->lkey()}, range}};
  CHECK(pair.client->ReadBulk(absl::MakeConstSpan(empty), 11).code() ==
        absl::StatusCode::kInvalidArgument);

  // Deregistered: the peer's NIC refuses the READ and the reading connection fails.
  remote->reset();
  REQUIRE(pair.client->ReadBulk(BulkSource{sink.data(), 4096, (*local)->lkey()}, range, 9).ok());
  REQUIRE(client_handler.WaitFor([&] { return client_handler.closed.has_value(); }));
  absl::MutexLock lock(&client_handler.mu);
  CHECK_FALSE(client_handler.done[9].ok());
  INFO(*client_handler.closed);
  CHECK_FALSE(client_handler.closed->ok());
}

TEST_CASE("a side that only writes bulk payloads keeps getting credits and arena space back",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr uint64_t kWrites = 2000;
  constexpr uint32_t kSize = 3000;  // not a multiple of 64: the ring pads and wraps
  Recorder server_handler, client_handler;
  Setup setup(config);
  server_handler.keep_bytes = false;
  ConnectionOptions options;
  options.recv_credits = 8;
  options.arena_size = 64 * 1024;
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);
  std::vector<uint8_t> source(kSize * 4);
  auto region = setup.device->RegisterMemory(source.data(), source.size());
  REQUIRE(region.ok());
  // Four source buffers used in turn; each is refilled only after its write is done.
  for (uint64_t i = 0; i < kWrites; ++i) {
    uint8_t* chunk = source.data() + (i % 4) * kSize;
    if (i >= 4) {
      REQUIRE(client_handler.WaitFor([&] { return client_handler.done.count(i - 4) == 1; }));
    }
    Fill(chunk, kSize, i);
    absl::Status s = pair.client->WriteBulk(BulkSource{chunk, kSize, (*region)->lkey()}, i);
    INFO("write " << i << ": " << s << "; " << pair.client->DebugString());
    REQUIRE(s.ok());
  }
  INFO(pair.client->DebugString() << " / " << pair.server->DebugString());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.bulks.size() == kWrites; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.size() == kWrites; }));
  absl::MutexLock lock(&server_handler.mu);
  size_t bad = 0;
  for (uint64_t i = 0; i < kWrites; ++i) bad += server_handler.bulks[i] != Filled(kSize, i);
  CHECK(bad == 0);
  ConnectionStats stats = pair.client->stats();
  std::printf("bulk only: %lu writes, %lu credit frames back from the reader\n",
              static_cast<unsigned long>(stats.bulk_sent),
              static_cast<unsigned long>(pair.server->stats().credit_frames_sent));
  CHECK(stats.max_credits_in_use <= stats.peer_max_recv_credits);
}

TEST_CASE("10,000 messages each way stay within credits, in order, with no RNR",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr uint64_t kMessages = 10000;
  constexpr uint32_t kSize = 100;
  Recorder server_handler, client_handler;
  Setup setup(config);
  // Checks order and content on the poller thread, without keeping the bytes.
  std::atomic<uint64_t> bad{0};
  auto checker = [&bad](std::atomic<uint64_t>* next) {
    return [&bad, next](const uint8_t* data, uint32_t size) {
      uint64_t seq = next->fetch_add(1);
      std::string expected = Filled(kSize, seq);
      if (size != kSize || std::memcmp(data, expected.data(), kSize) != 0) bad++;
    };
  };
  std::atomic<uint64_t> server_next{0}, client_next{0};
  server_handler.keep_bytes = client_handler.keep_bytes = false;
  server_handler.on_message = checker(&server_next);
  client_handler.on_message = checker(&client_next);
  ConnectionOptions options;
  options.recv_credits = 16;  // small, so credits are what limits the flow
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);

  int64_t rnr_before = PortCounter(setup.device->selection(), "rcvd_rnr_err");
  int64_t rnr_sent_before = PortCounter(setup.device->selection(), "send_rnr_err");
  std::atomic<int> send_errors{0};
  auto stream = [&](Connection* c) {
    for (uint64_t i = 0; i < kMessages; ++i) {
      if (absl::Status s = SendBytes(*c, Filled(kSize, i), i); !s.ok()) {
        std::printf("message %lu: %s\n", static_cast<unsigned long>(i), s.ToString().c_str());
        send_errors++;
        return;
      }
    }
  };
  std::thread from_server(stream, pair.server.get());
  stream(pair.client.get());
  from_server.join();
  CHECK(send_errors == 0);
  REQUIRE(server_handler.WaitFor([&] { return server_handler.message_count == kMessages; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.message_count == kMessages; }));
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.size() == kMessages; }));
  REQUIRE(server_handler.WaitFor([&] { return server_handler.done.size() == kMessages; }));
  CHECK(bad == 0);
  for (Recorder* r : {&server_handler, &client_handler}) {
    absl::MutexLock lock(&r->mu);
    CHECK(r->release_failures == 0);
    CHECK(r->duplicate_done == 0);
    for (auto& [token, status] : r->done) {
      if (!status.ok()) FAIL("token " << token << ": " << status);
    }
  }
  for (auto* c : {pair.client.get(), pair.server.get()}) {
    ConnectionStats stats = c->stats();
    std::printf(
        "stats: sent %lu, received %lu, credit frames %lu, waited %lu, "
        "max credits in use %u of %u\n",
        static_cast<unsigned long>(stats.messages_sent),
        static_cast<unsigned long>(stats.messages_received),
        static_cast<unsigned long>(stats.credit_frames_sent),
        static_cast<unsigned long>(stats.waited), stats.max_credits_in_use,
        stats.peer_recv_credits);
    CHECK(stats.messages_sent == kMessages);
    CHECK(stats.messages_received == kMessages);
    CHECK(stats.max_credits_in_use <= stats.peer_max_recv_credits);
    CHECK(stats.waited > 0);  // the sender outran 16 credits, so credits did hold it back
  }
  int64_t rnr_after = PortCounter(setup.device->selection(), "rcvd_rnr_err");
  int64_t rnr_sent_after = PortCounter(setup.device->selection(), "send_rnr_err");
  std::printf("RNR counters: rcvd_rnr_err %ld -> %ld, send_rnr_err %ld -> %ld\n",
              static_cast<long>(rnr_before), static_cast<long>(rnr_after),
              static_cast<long>(rnr_sent_before), static_cast<long>(rnr_sent_after));
  if (rnr_before < 0 || rnr_sent_before < 0) {
    WARN("the device has no RNR counters in sysfs: only zrpc's own accounting was checked");
  } else {
    CHECK(rnr_after == rnr_before);
    CHECK(rnr_sent_after == rnr_sent_before);
  }
}

namespace {

// A second Release of `handle`, a caller's bug: refused at once when this thread finds the
// connection's domain free, or, when another thread holds it (the poller finishing a batch), left
// to the holder, which finds it out and logs it (connection.h). Either way the receive is posted
// again only once.
void CheckSecondRelease(Connection& c, uint64_t handle, zrpc::testing::LogCapture& log) {
  const int logged = log.Count(zrpc::LogLevel::kError, "transport", "released twice");
  const absl::Status again = c.Release(handle);
  if (!again.ok()) {
    CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
    return;
  }
  CHECK(zrpc::testing::Eventually([&] {
    return log.Count(zrpc::LogLevel::kError, "transport", "released twice") == logged + 1;
  }));
}

}  // namespace

TEST_CASE(
    "an answer that gives back the message it answers carries that message's credit, "
    "even when the answer is refused",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::testing::LogCapture log(zrpc::LogLevel::kError);
  Recorder server_handler, client_handler;
  server_handler.hold = true;  // the test answers, with ReleaseAndSend
  client_handler.hold = true;
  Setup setup(config);
  ConnectionOptions options;
  options.recv_credits = 4;
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);
  // Ping-pong: each request spends one of the client's credits and its answer, which gives the
  // request back first, returns it. So the client never has more than one credit in use. With the
  // release after the answer, each answer returns the previous request's credit, and two are.
  for (int round = 0; round < 10; ++round) {
    REQUIRE(SendBytes(*pair.client, Filled(64, round), 0).ok());
    REQUIRE(server_handler.WaitFor([&] { return server_handler.held.size() == 1; }));
    uint64_t handle;
    {
      absl::MutexLock lock(&server_handler.mu);
      handle = server_handler.held.at(0);
      server_handler.held.clear();
    }
    absl::StatusOr<SendBuffer> buffer = pair.server->AcquireSendBuffer();
    REQUIRE(buffer.ok());
    Fill(buffer->data, 32, handle);
    REQUIRE(pair.server->ReleaseAndSend(handle, *buffer, 32).ok());
    CheckSecondRelease(*pair.server, handle, log);
    REQUIRE(client_handler.WaitFor(
        [&] { return client_handler.message_count == static_cast<uint64_t>(round + 1); }));
    // The client gives its answer back from this thread, before its next request, which then
    // carries the credit: released on the poller, the release would be applied at the end of
    // its batch and could miss that request, and two owed would make a credit frame.
    absl::MutexLock lock(&client_handler.mu);
    REQUIRE(client_handler.held.size() == 1);
    REQUIRE(pair.client->Release(client_handler.held.at(0)).ok());
    client_handler.held.clear();
  }
  CHECK(pair.client->stats().max_credits_in_use == 1);
  CHECK(pair.server->stats().credit_frames_sent == 0);  // every credit rode on an answer
  // Refused answers (too long, then on a closed connection) still give the message back, and
  // the send buffer too.
  REQUIRE(SendBytes(*pair.client, Filled(64, 99), 0).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.held.size() == 1; }));
  uint64_t handle;
  {
    absl::MutexLock lock(&server_handler.mu);
    handle = server_handler.held.at(0);
    server_handler.held.clear();
  }
  const uint32_t slots_before = SlotsInUse(*setup.device);  // only the client's may go down
  absl::StatusOr<SendBuffer> too_long = pair.server->AcquireSendBuffer();
  REQUIRE(too_long.ok());
  CHECK(pair.server->ReleaseAndSend(handle, *too_long, too_long->capacity + 1).code() ==
        absl::StatusCode::kInvalidArgument);
  CheckSecondRelease(*pair.server, handle, log);
  CHECK(SlotsInUse(*setup.device) <= slots_before);  // the send buffer went back
  REQUIRE(SendBytes(*pair.client, Filled(64, 100), 0).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.held.size() == 1; }));
  {
    absl::MutexLock lock(&server_handler.mu);
    handle = server_handler.held.at(0);
  }
  pair.server->Close();
  absl::StatusOr<SendBuffer> closed = pair.server->AcquireSendBuffer();
  if (closed.ok()) {  // a closed connection may refuse the buffer already
    CHECK(pair.server->ReleaseAndSend(handle, *closed, 8).code() == absl::StatusCode::kUnavailable);
  } else {
    static_cast<void>(pair.server->Release(handle));
  }
  CheckSecondRelease(*pair.server, handle, log);
}

namespace {

// A bare RC queue pair on `id`, owned by `pd`, `cq` and `qp`: enough for librdmacm to connect.
bool CreateRawQp(rdma_cm_id* id, PdOwner* pd, CqOwner* cq, CmQpOwner* qp) {
  pd->reset(ibv_alloc_pd(id->verbs));
  cq->reset(ibv_create_cq(id->verbs, 8, nullptr, nullptr, 0));
  if (*pd == nullptr || *cq == nullptr) return false;
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq->get();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd->get(), &attr) != 0) return false;
  qp->reset(id);
  return true;
}

// A raw librdmacm client offering `hello` as private data; returns how the connection ended.
absl::Status RawConnect(const std::string& addr, uint16_t port, const std::vector<uint8_t>& hello) {
  absl::Time deadline = absl::Now() + kTimeout;
  CmChannelOwner channel;
  CmIdOwner id;
  if (auto s = CreateCmChannelAndId(&channel, &id); !s.ok()) return s;
  if (auto s = ResolveRoute(channel.get(), id.get(), "", addr, port, deadline); !s.ok()) return s;
  PdOwner pd;
  CqOwner cq;
  CmQpOwner qp;
  if (!CreateRawQp(id.get(), &pd, &cq, &qp)) return absl::InternalError("cannot create a QP");
  rdma_conn_param param = ConnParam(hello.data(), static_cast<uint8_t>(hello.size()), 0, 0);
  if (rdma_connect(id.get(), &param) != 0) return absl::InternalError("rdma_connect");
  auto event = ExpectCmEvent(channel.get(), RDMA_CM_EVENT_ESTABLISHED, deadline);
  if (!event.ok()) return event.status();
  rdma_ack_cm_event(*event);
  rdma_disconnect(id.get());
  return absl::OkStatus();
}

std::vector<uint8_t> HelloBytes(uint32_t magic_xor, uint16_t version) {
  Hello hello;
  hello.version = version;
  hello.recv_credits = 16;
  hello.max_recv_credits = 16;
  hello.recv_size = 4096;
  std::vector<uint8_t> bytes(Hello::kSize);
  EncodeHello(hello, bytes.data());
  bytes[0] ^= static_cast<uint8_t>(magic_xor);
  return bytes;
}

}  // namespace

TEST_CASE("AcquireSendBuffer's leave_free keeps that many of max_send_slots for other messages",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler;
  Setup setup(config);
  ConnectionOptions options;
  options.max_send_slots = 10;
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);
  std::vector<SendBuffer> held;
  // Leaving 4 free: 6, then no more of that kind, with the reason.
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<SendBuffer> buffer = pair.client->AcquireSendBuffer(4);
    REQUIRE(buffer.ok());
    held.push_back(*buffer);
  }
  absl::StatusOr<SendBuffer> refused = pair.client->AcquireSendBuffer(4);
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(refused.status().message().find("less 4 kept for other messages") != std::string::npos);
  // The other messages still find theirs, up to max_send_slots.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<SendBuffer> buffer = pair.client->AcquireSendBuffer();
    REQUIRE(buffer.ok());
    held.push_back(*buffer);
  }
  CHECK(pair.client->AcquireSendBuffer().status().code() == absl::StatusCode::kResourceExhausted);
  for (const SendBuffer& buffer : held) pair.client->ReleaseSendBuffer(buffer);
  held.clear();
  // Asking to leave everything free still leaves one slot to that kind.
  absl::StatusOr<SendBuffer> one = pair.client->AcquireSendBuffer(1000);
  REQUIRE(one.ok());
  CHECK(pair.client->AcquireSendBuffer(1000).status().code() ==
        absl::StatusCode::kResourceExhausted);
  pair.client->ReleaseSendBuffer(*one);
}

TEST_CASE("a peer with another magic or version, or garbage, is refused on both sides",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder handler, client_handler;
  Setup setup(config);
  uint32_t slots_before = SlotsInUse(*setup.device);
  struct Case {
    const char* name;
    std::vector<uint8_t> hello;
    std::string reason;
  };
  std::vector<uint8_t> truncated = HelloBytes(0, kWireVersion);
  truncated.resize(12);
  std::vector<Case> cases = {
      {"bad magic", HelloBytes(0x55, kWireVersion), "not zrpc"},
      {"bad version", HelloBytes(0, kWireVersion + 1), absl::StrCat("version ", kWireVersion + 1)},
      {"garbage", std::vector<uint8_t>{1, 2, 3}, "not zrpc"},
      // The IB CM pads private data with zeros to its fixed size, so a short Hello reads as one
      // whose later fields are zero: refused for them.
      {"truncated", truncated, "may reach 0"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    setup.accepts->Use(setup.server_poller.get(), &handler);
    absl::Status client =
        RawConnect(setup.device->selection().addr, setup.listener->port(), c.hello);
    auto accepted = setup.accepts->Next(kTimeout);
    std::printf("%s: server says \"%s\"; client sees \"%s\"\n", c.name,
                std::string(accepted.status().message()).c_str(),
                std::string(client.message()).c_str());
    CHECK(accepted.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(accepted.status().message().find(c.reason) != absl::string_view::npos);
    CHECK(client.code() == absl::StatusCode::kUnavailable);
    CHECK(client.message().find("refused by the peer: zrpc") != absl::string_view::npos);
    CHECK(client.message().find(c.reason) != absl::string_view::npos);
  }
  CHECK(SlotsInUse(*setup.device) == slots_before);  // nothing leaked

  SECTION("a zrpc client refuses a server that answers with a bad Hello") {
    CmChannelOwner channel;
    CmIdOwner listen_id;
    REQUIRE(CreateCmChannelAndId(&channel, &listen_id).ok());
    sockaddr_storage local{};
    REQUIRE(ResolveSockaddr(setup.device->selection().addr, 0, &local).ok());
    REQUIRE(rdma_bind_addr(listen_id.get(), reinterpret_cast<sockaddr*>(&local)) == 0);
    REQUIRE(rdma_listen(listen_id.get(), 4) == 0);
    uint16_t port = ntohs(rdma_get_src_port(listen_id.get()));
    std::vector<uint8_t> bad = HelloBytes(0, kWireVersion + 1);
    CmIdOwner conn_id;
    PdOwner pd;
    CqOwner cq;
    CmQpOwner qp;
    std::thread raw_server([&] {
      auto request =
          ExpectCmEvent(channel.get(), RDMA_CM_EVENT_CONNECT_REQUEST, absl::Now() + kTimeout);
      if (!request.ok()) return;
      rdma_cm_id* id = (*request)->id;
      rdma_ack_cm_event(*request);
      conn_id.reset(id);
      if (!CreateRawQp(id, &pd, &cq, &qp)) return;
      rdma_conn_param param = ConnParam(bad.data(), static_cast<uint8_t>(bad.size()), 0, 0);
      rdma_accept(id, &param);
    });
    auto client =
        Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                            port, &client_handler, {}, kTimeout);
    raw_server.join();
    std::printf("client refusing the server: %s\n", client.status().ToString().c_str());
    CHECK(client.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(client.status().message().find(absl::StrCat("version ", kWireVersion + 1)) !=
          absl::string_view::npos);
    // The refused connection is freed when the client poller lets go of it too (it may hold it
    // for the length of a completion): wait a moment for that, never forever.
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (SlotsInUse(*setup.device) != slots_before && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    CHECK(SlotsInUse(*setup.device) == slots_before);
  }
}

TEST_CASE(
    "a peer killed mid-stream fails its connection and every outstanding operation, "
    "and other connections keep working",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder handler, s2, c2;
  Setup setup(config);
  constexpr uint32_t kPeerCredits = 8;
  constexpr uint64_t kSends = 40;  // more than the peer's credits: most of them must wait
  std::string peer = absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                                  "/tests/transport/transport_peer");
  std::string port = std::to_string(setup.listener->port());
  std::string credits = std::to_string(kPeerCredits);
  std::string addr = setup.device->selection().addr;
  char* argv[] = {peer.data(), addr.data(), port.data(), credits.data(), nullptr};
  setup.accepts->Use(setup.server_poller.get(), &handler);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, peer.c_str(), nullptr, nullptr, argv, environ) == 0);
  auto accepted = setup.accepts->Next(kTimeout);
  INFO(accepted.status());
  if (!accepted.ok()) kill(pid, SIGKILL);
  REQUIRE(accepted.ok());
  Connection& doomed = **accepted;

  // A second connection, in this process, that must survive the other's death.
  Pair survivor = ConnectPair(setup, &s2, &c2);

  for (uint64_t i = 0; i < kSends; ++i) REQUIRE(SendBytes(doomed, Filled(64, i), i).ok());
  // The peer never releases, so all but its credits (minus the reserved one) wait.
  REQUIRE(handler.WaitFor([&] { return handler.done.size() >= kPeerCredits - 1; }));
  REQUIRE(doomed.stats().waited > 0);

  absl::Time killed = absl::Now();
  REQUIRE(kill(pid, SIGKILL) == 0);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  REQUIRE(handler.WaitFor([&] { return handler.closed.has_value(); }, absl::Seconds(120)));
  absl::MutexLock lock(&handler.mu);
  absl::Duration took = handler.closed_at - killed;
  std::printf("peer killed: connection closed after %s with: %s\n",
              absl::FormatDuration(took).c_str(), handler.closed->ToString().c_str());
  CHECK(handler.closed->code() == absl::StatusCode::kUnavailable);
  CHECK(handler.duplicate_closed == 0);
  CHECK(handler.duplicate_done == 0);
  CHECK(handler.done.size() == kSends);  // every operation reported, exactly once
  int failed = 0;
  for (auto& [token, status] : handler.done) {
    if (!status.ok()) {
      ++failed;
      CHECK(status.code() == absl::StatusCode::kUnavailable);
    }
  }
  CHECK(failed >= static_cast<int>(kSends - kPeerCredits));
  CHECK_FALSE(doomed.open());
  CHECK(SendBytes(doomed, "late", 1000).code() == absl::StatusCode::kUnavailable);

  // The survivor still works, both ways.
  REQUIRE(SendBytes(*survivor.client, "still here", 1).ok());
  REQUIRE(SendBytes(*survivor.server, "me too", 2).ok());
  REQUIRE(s2.WaitFor([&] { return s2.messages.size() == 1; }));
  REQUIRE(c2.WaitFor([&] { return c2.messages.size() == 1; }));
}

// Before: each client connection kept the event channel it connected on, one file descriptor
// for its lifetime, so a client process with thousands of connections met RLIMIT_NOFILE.
TEST_CASE("client connections keep no file descriptor of their own once connected",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kConnections = 20;
  std::vector<std::unique_ptr<Recorder>> handlers;
  Setup setup(config);
  std::vector<std::shared_ptr<Connection>> clients;
  // One first, so that whatever the device opens once (at its first queue pair) is not counted.
  for (int round = 0; round < 2; ++round) {
    const int before = OpenFileDescriptors();
    for (int i = 0; i < (round == 0 ? 1 : kConnections); ++i) {
      handlers.push_back(std::make_unique<Recorder>());
      setup.accepts->Use(setup.server_poller.get(), handlers.back().get());
      handlers.push_back(std::make_unique<Recorder>());
      auto c =
          Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                              setup.listener->port(), handlers.back().get(), {}, kTimeout);
      INFO(c.status());
      REQUIRE(c.ok());
      clients.push_back(*c);
    }
    if (round == 1) {
      const int after = OpenFileDescriptors();
      std::printf("file descriptors: %d before %d connections, %d after\n", before, kConnections,
                  after);
      CHECK(after - before < kConnections / 2);
    }
  }
  for (auto& c : clients) c->Close();
  for (auto& h : handlers) CHECK(h->WaitFor([&] { return h->closed.has_value(); }));
  // The server's ends wait in the accept queue, which goes before the pollers (Setup).
}

// Before: a failed attempt's connection kept its setup channel until it was destroyed, which its
// poller does between passes; a channel reconnecting a thousand connections to a server that
// refused them, its poller busy with the thousand that had just failed, held a thousand
// descriptors at once (soak_scale_test: the server's restart in the same process met EMFILE).
TEST_CASE("a failed connect gives its file descriptor back at once, whatever its poller does",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kAttempts = 20;
  std::vector<std::unique_ptr<Recorder>> handlers;  // outlive the poller, which holds connections
  Setup setup(config);
  const uint16_t port = setup.listener->port();
  setup.listener.reset();  // nothing listens there now: every attempt is refused
  // A poller whose loop never runs: what it retires stays retired.
  auto stalled = Poller::Create(*setup.device);
  INFO(stalled.status());
  REQUIRE(stalled.ok());
  const int before = OpenFileDescriptors();
  for (int i = 0; i < kAttempts; ++i) {
    handlers.push_back(std::make_unique<Recorder>());
    auto c = Connection::Connect(*setup.device, **stalled, setup.device->selection().addr, port,
                                 handlers.back().get(), {}, kTimeout);
    INFO(c.status());
    REQUIRE(c.status().code() == absl::StatusCode::kUnavailable);
  }
  const int after = OpenFileDescriptors();
  std::printf("file descriptors: %d before %d refused attempts, %d after\n", before, kAttempts,
              after);
  CHECK(after - before < kAttempts / 2);
}

TEST_CASE("an event-mode poller sleeps while idle and wakes on traffic", "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler;
  Setup setup(config);  // the server's poller is in event mode
  REQUIRE(setup.server_poller->mode() == PollMode::kEvent);
  Pair pair = ConnectPair(setup, &server_handler, &client_handler);
  // Let the handshake's stragglers settle, then watch the loop while nothing happens.
  absl::SleepFor(absl::Milliseconds(200));
  uint64_t passes = setup.server_poller->passes();
  uint64_t wakeups = setup.server_poller->wakeups();
  absl::SleepFor(absl::Milliseconds(500));
  uint64_t idle_passes = setup.server_poller->passes() - passes;
  uint64_t busy_passes_before = setup.client_poller->passes();
  absl::SleepFor(absl::Milliseconds(100));
  uint64_t busy_passes = setup.client_poller->passes() - busy_passes_before;
  std::printf("idle: event-mode poller made %lu passes in 500 ms; the busy one %lu in 100 ms\n",
              static_cast<unsigned long>(idle_passes), static_cast<unsigned long>(busy_passes));
  CHECK(idle_passes <= 2);
  CHECK(busy_passes > 1000);  // the comparison shows the check can tell them apart
  for (uint64_t i = 0; i < 5; ++i) {
    REQUIRE(SendBytes(*pair.client, Filled(32, i), i).ok());
    REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == i + 1; }));
  }
  CHECK(setup.server_poller->wakeups() > wakeups);
  absl::MutexLock lock(&server_handler.mu);
  CHECK(server_handler.messages[4] == Filled(32, 4));
}

// Retry timing chosen, not inherited (ConnectionOptions::ack_timeout_exponent, retry_count,
// rnr_retry_count): read back from the device on both queue pairs. Each side's ACK timeout is its
// own; the connecting side's retry count is both queue pairs'; each side's RNR retry count is the
// one its peer asked for.
TEST_CASE("each queue pair holds the retry timing its options chose, read back from the device",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  struct Case {
    const char* name;
    ConnectionOptions server, client;
  };
  ConnectionOptions server_chosen, client_chosen;
  server_chosen.ack_timeout_exponent = 18;
  server_chosen.retry_count = 2;  // the accepting side's count is not used: its peer's is
  server_chosen.rnr_retry_count = 5;
  client_chosen.ack_timeout_exponent = 14;
  client_chosen.retry_count = 3;
  client_chosen.rnr_retry_count = 1;
  for (const Case& c : {Case{"defaults", {}, {}}, Case{"chosen", server_chosen, client_chosen}}) {
    INFO(c.name);
    Recorder server_handler, client_handler;
    Setup setup(config);
    Pair pair = ConnectPair(setup, &server_handler, &client_handler, c.server, c.client);
    absl::StatusOr<RetryTiming> client = pair.client->QueryRetryTiming();
    absl::StatusOr<RetryTiming> server = pair.server->QueryRetryTiming();
    REQUIRE(client.ok());
    REQUIRE(server.ok());
    std::printf("%s: client qp timeout %d retry %d rnr %d; server qp timeout %d retry %d rnr %d\n",
                c.name, client->ack_timeout_exponent, client->retry_count, client->rnr_retry_count,
                server->ack_timeout_exponent, server->retry_count, server->rnr_retry_count);
    CHECK(client->ack_timeout_exponent == c.client.ack_timeout_exponent);
    CHECK(server->ack_timeout_exponent == c.server.ack_timeout_exponent);
    CHECK(client->retry_count == c.client.retry_count);
    CHECK(server->retry_count == c.client.retry_count);
    CHECK(client->rnr_retry_count == c.server.rnr_retry_count);
    CHECK(server->rnr_retry_count == c.client.rnr_retry_count);
    REQUIRE(SendBytes(*pair.client, Filled(64, 1), 1).ok());
    CHECK(server_handler.WaitFor([&] { return server_handler.message_count == 1; }));
    pair.client->Close();
  }
}

TEST_CASE("retry timing out of range is refused on both sides, naming the option",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Setup setup(config);
  struct Bad {
    const char* option;
    void (*spoil)(ConnectionOptions&);
  };
  const Bad cases[] = {
      {"ack_timeout_exponent 11", [](ConnectionOptions& o) { o.ack_timeout_exponent = 11; }},
      {"ack_timeout_exponent 25", [](ConnectionOptions& o) { o.ack_timeout_exponent = 25; }},
      {"retry_count 0", [](ConnectionOptions& o) { o.retry_count = 0; }},
      {"retry_count 7", [](ConnectionOptions& o) { o.retry_count = 7; }},
      {"rnr_retry_count 7", [](ConnectionOptions& o) { o.rnr_retry_count = 7; }},
  };
  Recorder handler;
  for (const Bad& bad : cases) {
    INFO(bad.option);
    ConnectionOptions options;
    bad.spoil(options);
    auto client =
        Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr, 1,
                            &handler, options, kTimeout);
    REQUIRE_FALSE(client.ok());
    CHECK(client.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(client.status().message(), bad.option));
    ListenerOptions listen;
    listen.connection = options;
    auto listener = Listener::Create(*setup.device, "", 0, setup.accepts.get(), listen);
    REQUIRE_FALSE(listener.ok());
    CHECK(listener.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(listener.status().message(), bad.option));
  }
}

TEST_CASE("a poller refuses a spin out of [0, 1s]", "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  auto device = Device::Open(config);
  REQUIRE(device.ok());
  for (absl::Duration spin :
       {absl::Nanoseconds(-1), absl::Seconds(1) + absl::Nanoseconds(1), absl::InfiniteDuration()}) {
    PollerOptions options = DevicePollers::EventMode();
    options.spin = spin;
    auto poller = Poller::Create(**device, options);
    REQUIRE_FALSE(poller.ok());
    CHECK(poller.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(poller.status().message(), "PollerOptions::spin"));
  }
}

// Adaptive polling: after a completion an event-mode poller keeps polling for `spin` before it
// arms the CQ and sleeps, so traffic that keeps coming within it costs no wake-up, and a poller
// left idle past it sleeps. With no spin, each message after a pause wakes it.
// Before adaptive spin (transport/adaptive_spin.h), the 20 ms case polled for 20 ms after each
// message, thousands of passes each, though the next message came only after 100 ms.
TEST_CASE(
    "an event-mode poller polls after traffic while the next completion comes within its spin, "
    "then sleeps; sparser traffic it meets asleep",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Seconds(1), absl::Milliseconds(20)}) {
    INFO("spin " << absl::FormatDuration(spin));
    PollerOptions options = DevicePollers::EventMode();
    options.spin = spin;
    Recorder server_handler, client_handler;
    Setup setup(config, options);
    Pair pair = ConnectPair(setup, &server_handler, &client_handler);
    REQUIRE(SendBytes(*pair.client, "first", 0).ok());
    REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == 1; }));
    const uint64_t wakeups = setup.server_poller->wakeups();
    uint64_t passes_before = 0;  // from the third message on: the poller has seen two pauses
    for (uint64_t i = 1; i <= 5; ++i) {
      if (i == 3) passes_before = setup.server_poller->passes();
      absl::SleepFor(absl::Milliseconds(100));  // a pause: far longer than a round trip
      REQUIRE(SendBytes(*pair.client, Filled(32, i), i).ok());
      REQUIRE(server_handler.WaitFor([&] { return server_handler.messages.size() == i + 1; }));
    }
    const uint64_t woken = setup.server_poller->wakeups() - wakeups;
    const uint64_t passes = setup.server_poller->passes() - passes_before;
    std::printf(
        "spin %s: 5 messages 100 ms apart woke the poller %lu times, %lu passes for the last "
        "3; budget now %s\n",
        absl::FormatDuration(spin).c_str(), static_cast<unsigned long>(woken),
        static_cast<unsigned long>(passes),
        absl::FormatDuration(setup.server_poller->spin_budget()).c_str());
    if (spin == absl::ZeroDuration()) {
      CHECK(woken >= 5);
    } else if (spin == absl::Milliseconds(20)) {
      // The first pause outlasts the spin, after which the poller sleeps at once: a few passes
      // per message (the wake-up, the message, a look before arming; a credit frame's
      // completion right after a message may buy a spin of twice its gap), not 20 ms of
      // polling (thousands of passes) each time.
      CHECK(woken >= 4);
      CHECK(passes <= 3 * 500);
    } else {
      CHECK(woken == 0);
      // About twice the gaps it saw (100 ms), not the whole second.
      CHECK(setup.server_poller->spin_budget() < absl::Milliseconds(900));
      // Idle past the spin, it sleeps: its passes stop.
      absl::SleepFor(spin + absl::Milliseconds(500));
      const uint64_t idle_passes = setup.server_poller->passes();
      absl::SleepFor(absl::Milliseconds(300));
      CHECK(setup.server_poller->passes() - idle_passes <= 2);
    }
  }
}

// Before: a RECV completed before the peer's disconnect, but polled after this side had handled
// the disconnect event, was dropped, so a server's last answers at its graceful Shutdown could be
// lost by a client whose poller happened to see the hang-up first. The client's poller is
// stopped here while the server sends more messages than one poll pass takes (16) and hangs
// up; driven by hand afterwards, its first pass handles the disconnect after only 16 of them.
TEST_CASE(
    "messages that arrived before the peer's orderly disconnect are delivered, even when "
    "the disconnect is seen first",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler;
  Setup setup(config);
  Pair pair = ConnectPair(setup, &server_handler, &client_handler);
  setup.client_poller->Stop();
  constexpr int kMessages = 24;  // more than a pass's 16, fewer than the client's 32 credits
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE(SendBytes(*pair.server, Filled(100, i + 1), i).ok());
  }
  // Every SEND acknowledged by the client's NIC, then the server hangs up.
  REQUIRE(server_handler.WaitFor([&] { return server_handler.done.size() == kMessages; }));
  pair.server->Close();
  absl::SleepFor(absl::Milliseconds(300));  // the disconnect reaches the client's CM channel
  const absl::Time until = absl::Now() + kTimeout;
  while (absl::Now() < until) {
    setup.client_poller->RunOnce(absl::Milliseconds(10));
    absl::MutexLock lock(&client_handler.mu);
    if (client_handler.closed.has_value()) break;
  }
  absl::MutexLock lock(&client_handler.mu);
  REQUIRE(client_handler.closed.has_value());
  CHECK(zrpc::transport::IsPeerDisconnect(*client_handler.closed));
  REQUIRE(client_handler.messages.size() == kMessages);
  for (int i = 0; i < kMessages; ++i) CHECK(client_handler.messages[i] == Filled(100, i + 1));
}

// Before: a connect whose deadline ran out between resolving the address and the route passed
// a timeout of 0 to rdma_resolve_route, which the kernel refuses with EINVAL, and the channel
// took the deadline for a broken server (UNAVAILABLE, then backoff for every other call).
TEST_CASE(
    "a connect whose deadline passes while resolving fails DEADLINE_EXCEEDED, never with "
    "the kernel's EINVAL",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler;
  Setup setup(config);
  setup.accepts->Use(setup.server_poller.get(), &server_handler);
  for (absl::Duration timeout :
       {absl::Nanoseconds(1), absl::Microseconds(50), absl::Microseconds(200)}) {
    INFO(absl::FormatDuration(timeout));
    auto client =
        Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                            setup.listener->port(), &client_handler, {}, timeout);
    if (client.ok()) continue;  // fast enough after all
    INFO(client.status());
    CHECK(client.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
}

TEST_CASE(
    "a queue pair error the device reports fails its connection at once, saying so; the "
    "poller's other connections and a report of a queue pair since gone are unaffected",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  // Before the pollers: they outlive every report to these.
  Recorder server_a, client_a, server_b, client_b;
  Setup setup(config);
  Pair a = ConnectPair(setup, &server_a, &client_a);
  Pair b = ConnectPair(setup, &server_b, &client_b);
  REQUIRE(a.client->queue_pair() != nullptr);
  // A report naming a's queue pair number with another queue pair: one destroyed before its
  // report was carried over, whose number a has now. Nothing happens to a.
  ibv_qp gone{};
  gone.qp_num = a.client->queue_pair()->qp_num;
  setup.client_poller->device_events()->OnQueuePairEvent(&gone, IBV_EVENT_QP_FATAL);
  REQUIRE(SendBytes(*a.client, Filled(64, 1), 1).ok());
  CHECK(server_a.WaitFor([&] { return server_a.message_count == 1; }));
  {
    absl::MutexLock lock(&client_a.mu);
    CHECK_FALSE(client_a.closed.has_value());
  }
  // The report of a's own queue pair, as the device's reader hands it over: a fails at once
  // (an idle connection, with nothing posted whose flush would tell it), naming the event.
  setup.client_poller->device_events()->OnQueuePairEvent(a.client->queue_pair(),
                                                         IBV_EVENT_QP_FATAL);
  REQUIRE(client_a.WaitFor([&] { return client_a.closed.has_value(); }, absl::Seconds(10)));
  {
    absl::MutexLock lock(&client_a.mu);
    INFO(*client_a.closed);
    CHECK(client_a.closed->code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(client_a.closed->message()),
               Catch::Contains("the RDMA device failed this connection's queue pair") &&
                   Catch::Contains(ibv_event_type_str(IBV_EVENT_QP_FATAL)));
  }
  // b, on the same pollers, goes on.
  REQUIRE(SendBytes(*b.client, Filled(64, 2), 2).ok());
  CHECK(server_b.WaitFor([&] { return server_b.message_count == 1; }));
  {
    absl::MutexLock lock(&client_b.mu);
    CHECK_FALSE(client_b.closed.has_value());
  }
  // No event was read from the device here: the reports above were handed over directly.
  const AsyncEventCounts counts = setup.device->async_events();
  std::printf("device events read: %llu port down, %llu port active, %llu queue pair errors\n",
              static_cast<unsigned long long>(counts.port_down),
              static_cast<unsigned long long>(counts.port_active),
              static_cast<unsigned long long>(counts.queue_pair_errors));
  b.client->Close();
}
