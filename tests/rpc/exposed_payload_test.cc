// Payloads exposed for the peer to pull through memory windows (rpc/WIRE.md, "Scope of the
// exposure"): a payload in memory registered in advance costs no registration per call, and a
// response's key, read by a raw-verbs client, works from that client's queue pair alone and only
// until its pulled (a SEND_WITH_INV of the key) lands; the next call's exposure does not revive
// it. A zrpc channel calling beside the raw clients is unaffected by each refused READ.
//
// Built three times: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS); over fakeverbs that looks
// and acts like rxe (ZRPC_FAKE_LIKE_RXE: windows open the whole region beneath them, and a bind
// behind unretired work fails the queue pair, as rxe's retransmission would make it); and on the
// harness's device (tag "rdma"). Where binds do not survive a retransmission (rxe), a connection
// binds only on a quiet send queue (transport/connection.h, QuietLocked): the case with traffic
// from several threads shows that nothing breaks and nothing is registered per call.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/registered_memory.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/pattern.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/skip.h"
#include "tests/transport/raw_peer.h"
#include "transport/device.h"
#include "transport/wire.h"
#ifdef ZRPC_OVER_FAKEVERBS
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#ifdef ZRPC_FAKE_LIKE_RXE
constexpr bool kLikeRxe = true;
#else
constexpr bool kLikeRxe = false;
#endif
// Set before the device opens (the process's devices are shared, so every case sets the same).
#define ZRPC_TEST_DEVICE(var)                                                         \
  zrpc::fakeverbs::SetCapabilities({/*shared_receive_queues=*/true, /*windows=*/true, \
                                    /*async_events=*/false, /*like_rxe=*/kLikeRxe});  \
  const zrpc::transport::DeviceConfig var = zrpc::fakeverbs::FakeDevice()
#else
#include "tests/rdma_device.h"
#define ZRPC_TEST_DEVICE(var) ZRPC_REQUIRE_RDMA_DEVICE(var)
#endif

namespace {

using zrpc::OutgoingBulk;
using zrpc::RpcHeader;
using zrpc::RpcKind;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::testing::Eventually;
using zrpc::testing::Filled;
using zrpc::testing::Key;
using zrpc::testing::kLong;
using zrpc::testing::RawPeer;
using zrpc::testing::Served;
using zrpc::testing::Within;

constexpr uint32_t kStoreId = zrpc::ServiceId("zrpc.examples.ObjectStore");
constexpr uint16_t kGetIndex = 1;    // rpc 1 of proto/examples/object_store.proto
constexpr size_t kObject = 1 << 20;  // past the channel's 256 KiB arena: pulled

// Get answers from memory the server registered in advance: all of it ("whole"), its first half
// ("part"), or from bytes never registered ("plain"). Counts the payloads given back. Put keeps
// what it is given (KeepingStore).
class ExposingStore : public zrpc::testing::KeepingStore {
 public:
  absl::Status Get(zrpc::ServerContext&, const ObjectKey& key, ObjectInfo* info,
                   OutgoingBulk* bulk) override {
    auto release = [this] { released.fetch_add(1); };
    if (key.name() == "plain") {
      *bulk = OutgoingBulk(plain.data(), plain.size(), release);
    } else {
      absl::StatusOr<OutgoingBulk> from =
          memory->Bulk(0, key.name() == "part" ? memory->size() / 2 : memory->size(), release);
      if (!from.ok()) return from.status();
      *bulk = *std::move(from);
    }
    info->set_size(bulk->size());
    return absl::OkStatus();
  }

  std::string bytes = Filled(kObject, 3);
  std::string plain = Filled(kObject, 4);
  std::unique_ptr<zrpc::RegisteredMemory> memory;
  std::atomic<int> released{0};
};

// A server with `store`'s memory registered, and a channel on a device of its own (other slot
// options), so that each side's registrations are counted apart.
struct Setup {
  Setup(const zrpc::transport::DeviceConfig& config, ExposingStore& store,
        const zrpc::ServerOptions& server_options = {})
      : served(config, {&store}, server_options, ChannelOptions()) {
    absl::StatusOr<zrpc::RegisteredMemory> registered =
        served.server->RegisterMemory(store.bytes.data(), store.bytes.size());
    INFO(registered.status());
    REQUIRE(registered.ok());
    store.memory = std::make_unique<zrpc::RegisteredMemory>(*std::move(registered));
  }
  static zrpc::ChannelOptions ChannelOptions() {
    zrpc::ChannelOptions options;
    options.slots.slot_size = 8192;  // not the server's: a device (and PD) of the channel's own
    return options;
  }
  // A call through the channel that must succeed and bring back `expected`.
  void Get(const std::string& name, const std::string& expected) {
    ObjectStore::Stub stub(served.channel.get());
    ObjectInfo info;
    zrpc::IncomingBulk bulk;
    const absl::Status s = stub.Get(Key(name), &info, &bulk, Within(kLong));
    INFO(s);
    REQUIRE(s.ok());
    CHECK(zrpc::testing::FirstDifference(bulk.view(), expected) == "equal");
  }
  Served served;
};

// Whether the device exposes through windows, and whether a window opens only its own range.
struct WindowFacts {
  bool windows = false;
  bool bound_range = false;
};
WindowFacts FactsOf(const zrpc::transport::DeviceConfig& config) {
  auto device = zrpc::transport::Device::Open(config);
  INFO(device.status());
  REQUIRE(device.ok());
  // Windows are what the runtime exposes pulled payloads through (rpc_connection_bulk.cc).
  return WindowFacts{(*device)->has_windows(), (*device)->windows_bound_range()};
}

TEST_CASE(
    "a payload pulled from memory registered in advance costs no registration per call; a part "
    "of it or unregistered bytes one each where it must",
    "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  const WindowFacts facts = FactsOf(config);
  ExposingStore store;
  Setup setup(config, store);
  constexpr int kCalls = 3;
  struct Case {
    const char* name;
    std::string expected;
    uint64_t per_call;  // registrations the server makes per call
  };
  const Case cases[] = {
      // With windows, the registration itself is bound (no registration); without, one each.
      {"whole", store.bytes, facts.windows ? 0u : 1u},
      // rxe's windows open the whole region beneath them: a part needs a region of its own.
      {"part", store.bytes.substr(0, kObject / 2), facts.windows && facts.bound_range ? 0u : 1u},
      {"plain", store.plain, 1},
  };
  int released = 0;
  for (const Case& c : cases) {
    INFO(c.name << " (windows " << facts.windows << ", bound range " << facts.bound_range << ")");
    setup.Get(c.name, c.expected);  // warm-up: the channel's and server's first use of anything
    const uint64_t before = setup.served.server->stats().memory_registrations;
    for (int i = 0; i < kCalls; ++i) setup.Get(c.name, c.expected);
    const uint64_t made = setup.served.server->stats().memory_registrations - before;
    std::printf("exposed_payload_test: %s: %llu registrations per pulled response (target %llu)\n",
                c.name, static_cast<unsigned long long>(made / kCalls),
                static_cast<unsigned long long>(c.per_call));
    CHECK(made == c.per_call * kCalls);
    released += kCalls + 1;
    CHECK(Eventually([&] { return store.released == released; }));
  }

  // The request's way: a payload from the channel's registered memory, pulled by the server.
  std::string object = Filled(kObject, 5);
  absl::StatusOr<zrpc::RegisteredMemory> mine =
      setup.served.channel->RegisterMemory(object.data(), object.size());
  REQUIRE(mine.ok());
  ObjectStore::Stub stub(setup.served.channel.get());
  zrpc::examples::PutReply put;
  const uint64_t before = setup.served.channel->stats().memory_registrations;
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<OutgoingBulk> bulk = mine->Bulk(0, object.size());
    REQUIRE(bulk.ok());
    const absl::Status s = stub.Put(Key("mine"), *std::move(bulk), &put, Within(kLong));
    INFO(s);
    REQUIRE(s.ok());
    CHECK(put.stored_bytes() == kObject);
  }
  const uint64_t made = setup.served.channel->stats().memory_registrations - before;
  std::printf("exposed_payload_test: request: %llu registrations per pulled request (target %u)\n",
              static_cast<unsigned long long>(made / kCalls), facts.windows ? 0u : 1u);
  CHECK(made == (facts.windows ? 0u : 1u) * kCalls);
  CHECK(setup.served.channel->stats().connections_lost == 0);
}

// A client of the server written over raw verbs: sends Get requests by hand, asking for the
// response's payload exposed (kRpcFlagPullResponse), and reads what the answer names.
class RawCaller {
 public:
  struct Answer {
    RpcHeader header;
    zrpc::PullDescriptor pull;
    uint32_t invalidate_rkey = 0;
  };

  RawCaller(const zrpc::transport::DeviceConfig& config, uint16_t port) {
    RawPeer::Options options;
    options.reads = 1;
    const absl::Status connected = peer.Connect(config.addr, port, options);
    INFO(connected);
    REQUIRE(connected.ok());
  }

  Answer Get(const std::string& name) {
    ObjectKey key;
    key.set_name(name);
    const std::string body = key.SerializeAsString();
    RpcHeader request;
    request.kind = RpcKind::kRequest;
    request.flags = zrpc::kRpcFlagPullResponse;
    request.service_id = kStoreId;
    request.method_index = kGetIndex;
    request.call_id = next_call_++;
    zrpc::EncodeRpcHeader(request, peer.payload());
    std::memcpy(peer.payload() + RpcHeader::kSize, body.data(), body.size());
    const uint64_t before = peer.data_frames;
    REQUIRE(peer.Send(zrpc::transport::FrameKind::kData, 0,
                      static_cast<uint32_t>(RpcHeader::kSize + body.size()), kLong)
                .ok());
    REQUIRE(Eventually([&] {
      peer.Poll();
      return peer.data_frames > before;
    }));
    const auto message = absl::MakeConstSpan(peer.last_data);
    absl::StatusOr<RpcHeader> header = zrpc::DecodeRpcHeader(message);
    REQUIRE(header.ok());
    REQUIRE(header->kind == RpcKind::kResponse);
    REQUIRE(header->call_id == request.call_id);
    REQUIRE(header->pulls());
    absl::StatusOr<zrpc::MessageLayout> layout = zrpc::DecodeLayout(*header, message);
    REQUIRE(layout.ok());
    REQUIRE(layout->pull_count == 1);
    return Answer{*header, layout->pulls[0], layout->invalidate_rkey};
  }

  // Reads the first `length` bytes the answer names through its key.
  ibv_wc_status Read(const Answer& answer, uint32_t length = RawPeer::kReadBuffer) {
    return peer.ReadRaw(answer.pull.addr, answer.pull.rkey, length, kLong);
  }

  // Says pulled for `answer`: a SEND_WITH_INV of its key when it is a window's, else a SEND.
  void Pulled(const Answer& answer) {
    zrpc::EncodeRpcHeader(RpcHeader::Pulled(answer.header.call_id, answer.pull.addr),
                          peer.payload());
    std::optional<uint32_t> invalidate;
    if (answer.invalidate_rkey != 0) invalidate = answer.invalidate_rkey;
    const absl::Status sent =
        peer.Send(zrpc::transport::FrameKind::kData, 0, RpcHeader::kSize, kLong, invalidate);
    INFO(sent);
    REQUIRE(sent.ok());
  }

  RawPeer peer;

 private:
  uint64_t next_call_ = 1;
};

TEST_CASE(
    "a response's window key reads from its own connection only, and only until its pulled; the "
    "next call's does not revive it; a channel beside is unaffected",
    "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  if (!FactsOf(config).windows) {
    ZRPC_SKIP(
        "this device has no type-2 memory windows: pulled payloads are registered per call; "
        "exposed_payload_fake_test holds this case");
  }
  ExposingStore store;
  Setup setup(config, store);
  const uint16_t port = setup.served.server->port();
  const std::string prefix = store.bytes.substr(0, RawPeer::kReadBuffer);
  auto read_is_the_object = [&](RawCaller& caller) {
    return std::memcmp(caller.peer.read_bytes(), prefix.data(), prefix.size()) == 0;
  };
  setup.Get("whole", store.bytes);
  int released = 1;

  // Another queue pair of the server's device, under the very key: refused, and only the thief
  // pays; the reader's connection reads on and ends the exposure with its pulled.
  RawCaller reader(config, port), thief(config, port);
  const RawCaller::Answer first = reader.Get("whole");
  CHECK(first.pull.flags == zrpc::kPullWindow);
  CHECK(first.invalidate_rkey == first.pull.rkey);
  CHECK(first.pull.addr == reinterpret_cast<uintptr_t>(store.bytes.data()));
  CHECK(thief.Read(first) == IBV_WC_REM_ACCESS_ERR);
  REQUIRE(reader.Read(first) == IBV_WC_SUCCESS);
  CHECK(read_is_the_object(reader));
  reader.Pulled(first);
  ++released;
  CHECK(Eventually([&] { return store.released == released; }));
  setup.Get("whole", store.bytes);
  ++released;

  // The next call's payload, from the same memory: a new key; the first call's refused.
  const RawCaller::Answer second = reader.Get("whole");
  CHECK(second.pull.rkey != first.pull.rkey);
  REQUIRE(reader.Read(second) == IBV_WC_SUCCESS);
  CHECK(read_is_the_object(reader));
  CHECK(reader.Read(first) == IBV_WC_REM_ACCESS_ERR);  // costs the reader its queue pair
  // Its exposure ends with its connection: the payload comes back without a pulled.
  reader.peer.Disconnect();
  ++released;
  CHECK(Eventually([&] { return store.released == released; }));
  setup.Get("whole", store.bytes);
  ++released;

  // A READ after the reader's own pulled, with nothing exposed since.
  RawCaller late(config, port);
  const RawCaller::Answer third = late.Get("plain");
  REQUIRE(late.Read(third) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(late.peer.read_bytes(), store.plain.data(), RawPeer::kReadBuffer) == 0);
  late.Pulled(third);
  ++released;
  CHECK(Eventually([&] { return store.released == released; }));
  CHECK(late.Read(third) == IBV_WC_REM_ACCESS_ERR);

  // The channel beside them never noticed.
  setup.Get("whole", store.bytes);
  ++released;
  CHECK(Eventually([&] { return store.released == released; }));
  CHECK(setup.served.channel->stats().connections_lost == 0);
  CHECK(setup.served.channel->stats().protocol_violations == 0);
}

TEST_CASE(
    "past max_exposures a response is exposed by a registration of its own, and both ways of "
    "exposing are read and ended",
    "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  if (!FactsOf(config).windows) {
    ZRPC_SKIP(
        "this device has no type-2 memory windows: pulled payloads are registered per call; "
        "exposed_payload_fake_test holds this case");
  }
  ExposingStore store;
  zrpc::ServerOptions server_options;
  server_options.listener.connection.max_exposures = 1;
  Setup setup(config, store, server_options);
  RawCaller reader(config, setup.served.server->port());
  const uint64_t before = setup.served.server->stats().memory_registrations;
  // Neither pulled yet: the first holds the connection's one window, the second a registration.
  const RawCaller::Answer windowed = reader.Get("whole");
  const RawCaller::Answer registered = reader.Get("whole");
  CHECK(windowed.pull.flags == zrpc::kPullWindow);
  CHECK(registered.pull.flags == 0);
  CHECK(registered.invalidate_rkey == 0);
  CHECK(setup.served.server->stats().memory_registrations - before == 1);
  const std::string prefix = store.bytes.substr(0, RawPeer::kReadBuffer);
  for (const RawCaller::Answer* answer : {&registered, &windowed}) {
    REQUIRE(reader.Read(*answer) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(reader.peer.read_bytes(), prefix.data(), prefix.size()) == 0);
    reader.Pulled(*answer);
  }
  CHECK(Eventually([&] { return store.released == 2; }));
  // The registration is gone with its pulled too; the channel beside carries on.
  CHECK(reader.Read(registered) == IBV_WC_REM_ACCESS_ERR);
  setup.Get("whole", store.bytes);
  CHECK(setup.served.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "pulled payloads both ways and arena loans from several threads at once: no connection "
    "breaks, no registration per call",
    "[exposure]") {
  ZRPC_TEST_DEVICE(config);
  const WindowFacts facts = FactsOf(config);
  ExposingStore store;
  Setup setup(config, store);
  setup.Get("whole", store.bytes);  // warm-up
#ifdef ZRPC_OVER_FAKEVERBS
  const zrpc::fakeverbs::Counters fake_before = zrpc::fakeverbs::counters();
#endif
  const uint64_t registrations_before = setup.served.server->stats().memory_registrations;
  constexpr int kThreads = 3;
  constexpr int kRounds = 12;
  // Each round: a response pulled from registered memory (the server binds), a request pulled
  // from plain memory (the channel binds), and a small payload written into the server's arena
  // (lent on demand: the server binds the loan's window).
  const std::string big = Filled(kObject, 6);
  const std::string small = Filled(64 << 10, 7);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ObjectStore::Stub stub(setup.served.channel.get());
      for (int i = 0; i < kRounds; ++i) {
        ObjectInfo info;
        zrpc::IncomingBulk got;
        absl::Status s = stub.Get(Key("whole"), &info, &got, Within(kLong));
        if (!s.ok() || got.view() != store.bytes) {
          std::printf("exposed_payload_test: thread %d round %d Get: %s\n", t, i,
                      s.ToString().c_str());
          failed.fetch_add(1);
        }
        for (const std::string* object : {&big, &small}) {
          zrpc::examples::PutReply put;
          s = stub.Put(Key(absl::StrCat("t", t, "-", object->size())),
                       OutgoingBulk(object->data(), object->size(), nullptr), &put, Within(kLong));
          if (!s.ok() || put.stored_bytes() != object->size()) {
            std::printf("exposed_payload_test: thread %d round %d Put of %zu: %s\n", t, i,
                        object->size(), s.ToString().c_str());
            failed.fetch_add(1);
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failed == 0);
  for (int t = 0; t < kThreads; ++t) {
    CHECK(store.object(absl::StrCat("t", t, "-", big.size())) == big);
    CHECK(store.object(absl::StrCat("t", t, "-", small.size())) == small);
  }
  CHECK(Eventually([&] { return store.released == 1 + kThreads * kRounds; }));
  // The server registers the destination of each large request it pulls; a response pulled from
  // its registered memory costs nothing where windows expose it.
  const uint64_t made = setup.served.server->stats().memory_registrations - registrations_before;
  const uint64_t target = kThreads * kRounds * (facts.windows ? 1u : 2u);
  std::printf(
      "exposed_payload_test: %d large requests pulled and %d responses pulled from registered "
      "memory under traffic: %llu server registrations (target %llu)\n",
      kThreads * kRounds, kThreads * kRounds, static_cast<unsigned long long>(made),
      static_cast<unsigned long long>(target));
  CHECK(made == target);
  CHECK(setup.served.channel->stats().connections_lost == 0);
  CHECK(setup.served.server->stats().connections_closed == 0);
  CHECK(setup.served.channel->stats().protocol_violations == 0);
#ifdef ZRPC_OVER_FAKEVERBS
  const zrpc::fakeverbs::Counters fake = zrpc::fakeverbs::counters();
  std::printf(
      "exposed_payload_test: %llu windows bound, %llu binds a retransmission would break "
      "(target 0)\n",
      static_cast<unsigned long long>(fake.binds - fake_before.binds),
      static_cast<unsigned long long>(fake.binds_replayed - fake_before.binds_replayed));
  CHECK(fake.binds - fake_before.binds >= static_cast<uint64_t>(2 * kThreads * kRounds));
  CHECK(fake.binds_replayed == fake_before.binds_replayed);
#endif
}

}  // namespace
