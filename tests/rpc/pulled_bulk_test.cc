// Bulk payloads larger than the receiver's arena, pulled by the receiver with RDMA READ (rpc/
// WIRE.md, "Pulled payloads"), on a real device (tag "rdma"; tools/test runs it inside
// tools/softroce): both ways, byte-checked, at and past the limits, within the memory budget,
// and with calls that end while their payload is exposed.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "rpc/connection/rpc_connection.h"
#include "rpc/connection/rpc_header.h"
#include "rpc/registered_memory.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/pattern.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/transport/recorder.h"

namespace {

using zrpc::IncomingBulk;
using zrpc::OutgoingBulk;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::examples::PutReply;
using zrpc::testing::Eventually;
using zrpc::testing::Filled;
using zrpc::testing::FirstDifference;
using zrpc::testing::Key;
using zrpc::testing::kLong;
using zrpc::testing::Served;
using zrpc::testing::Within;

// Get answers "<size>:<seed>" with that pattern (made once per key, then answered from at
// once); Transform reverses.
class Store : public zrpc::testing::KeepingStore {
 public:
  absl::Status Get(zrpc::ServerContext&, const ObjectKey& key, ObjectInfo* info,
                   OutgoingBulk* bulk) override {
    const size_t colon = key.name().find(':');
    const size_t size = std::stoul(key.name().substr(0, colon));
    const uint64_t seed = std::stoul(key.name().substr(colon + 1));
    std::shared_ptr<const std::string> pattern;
    {
      absl::MutexLock lock(&patterns_mu_);
      std::shared_ptr<const std::string>& cached = patterns_[key.name()];
      if (cached == nullptr) {
        // Seed 0: one repeated byte, quick to make at hundreds of MiB under emulation.
        cached = std::make_shared<const std::string>(seed == 0 ? std::string(size, 'c')
                                                               : Filled(size, seed));
      }
      pattern = cached;
    }
    info->set_size(size);
    *bulk = OutgoingBulk(pattern->data(), size, [pattern] {});
    return absl::OkStatus();
  }
  absl::Status Transform(zrpc::ServerContext&, const ObjectKey&, IncomingBulk bulk,
                         ObjectInfo* info, OutgoingBulk* out) override {
    std::string reversed(bulk.view().rbegin(), bulk.view().rend());
    info->set_size(reversed.size());
    *out = OutgoingBulk::Copy(std::move(reversed));
    return absl::OkStatus();
  }

 private:
  absl::Mutex patterns_mu_;
  std::map<std::string, std::shared_ptr<const std::string>> patterns_;
};

TEST_CASE("payloads past the arena are pulled, both ways, byte-checked") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});  // default arenas: 256 KiB each way
  ObjectStore::Stub stub(served.channel.get());
  // 64 MiB is eight READs of rxe's 8 MiB; the CPU work around it (patterns, compares) is what
  // takes the time under emulation, so the largest size goes one way each and is not reversed.
  for (size_t size : {size_t{256 << 10} + 1, size_t{4} << 20, size_t{64} << 20}) {
    INFO("payload of " << size << " bytes");
    // A guard against a hang, not a speed check: under ASan, in the emulated guest, beside the
    // other RDMA tests CI runs at once, 64 MiB took past 30 s (CI of 2026-11-25).
    const zrpc::CallOptions within = Within(size > (4u << 20) ? absl::Minutes(5) : kLong);
    const std::string object = Filled(size, size);
    PutReply put;
    absl::Status s = stub.Put(Key("p"), OutgoingBulk(object.data(), size), &put, within);
    INFO(s);
    REQUIRE(s.ok());
    CHECK(put.stored_bytes() == size);
    CHECK(FirstDifference(object, store.object("p")) == "equal");

    ObjectInfo info;
    IncomingBulk got;
    s = stub.Get(Key(absl::StrCat(size, ":", size)), &info, &got, within);
    INFO(s);
    REQUIRE(s.ok());
    CHECK(FirstDifference(object, got.view()) == "equal");
    got.Reset();
    if (size > (4u << 20)) continue;

    IncomingBulk reversed;
    s = stub.Transform(Key("t"), OutgoingBulk(object.data(), size), &info, &reversed, within);
    INFO(s);
    REQUIRE(s.ok());
    CHECK(FirstDifference(std::string(object.rbegin(), object.rend()), reversed.view()) == "equal");
  }
  // Pulled straight from the caller's bytes: nothing was staged for them.
  CHECK(served.channel->stats().bulk_bytes_staged == 0);
  CHECK(served.channel->stats().connections_lost == 0);
}

TEST_CASE("a registered buffer larger than the arena is pulled from where it is") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  constexpr size_t kSize = 3 << 20;
  std::vector<uint8_t> bytes(kSize);
  zrpc::testing::Fill(bytes.data(), kSize, 8);
  absl::StatusOr<zrpc::RegisteredMemory> memory =
      served.channel->RegisterMemory(bytes.data(), kSize);
  REQUIRE(memory.ok());
  for (int i = 0; i < 3; ++i) {
    PutReply put;
    absl::Status s = stub.Put(Key("r"), *memory->Bulk(0, kSize), &put, Within(kLong));
    INFO(s);
    REQUIRE(s.ok());
  }
  CHECK(store.object("r") == std::string(bytes.begin(), bytes.end()));
  CHECK(served.channel->stats().bulk_bytes_zero_copy == 3 * kSize);
  CHECK(served.channel->stats().bulk_bytes_staged == 0);
}

TEST_CASE(
    "max_bulk_size: the limit passes, the limit + 1 fails naming the option, before any "
    "byte moves") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr size_t kLimit = 1 << 20;
  Store store;
  zrpc::ServerOptions server_options;
  server_options.max_bulk_size = kLimit;
  zrpc::ChannelOptions channel_options;
  channel_options.max_bulk_size = kLimit;
  Served served(config, {&store}, server_options, channel_options);
  ObjectStore::Stub stub(served.channel.get());

  const std::string object = Filled(kLimit + 1, 1);
  PutReply put;
  absl::Status s = stub.Put(Key("at"), OutgoingBulk(object.data(), kLimit), &put, Within(kLong));
  INFO(s);
  CHECK(s.ok());
  s = stub.Put(Key("past"), OutgoingBulk(object.data(), kLimit + 1), &put, Within(kLong));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "ServerOptions::max_bulk_size"));
  CHECK(store.puts.load() == 1);  // the handler never saw it

  ObjectInfo info;
  IncomingBulk got;
  s = stub.Get(Key(absl::StrCat(kLimit, ":", 2)), &info, &got, Within(kLong));
  INFO(s);
  CHECK(s.ok());
  CHECK(got.view() == Filled(kLimit, 2));
  got.Reset();
  s = stub.Get(Key(absl::StrCat(kLimit + 1, ":", 2)), &info, &got, Within(kLong));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "ChannelOptions::max_bulk_size"));
  CHECK(got.empty());
  // Both sides still serve, on the same connection.
  s = stub.Put(Key("after"), OutgoingBulk(object.data(), kLimit), &put, Within(kLong));
  CHECK(s.ok());
  CHECK(served.channel->stats().connections_lost == 0);
}

TEST_CASE("max_pulled_bytes bounds what pulled payloads hold at once") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  zrpc::ServerOptions server_options;
  server_options.max_bulk_size = 2 << 20;
  server_options.max_pulled_bytes = 3 << 20;
  Served served(config, {&store}, server_options);
  ObjectStore::Stub stub(served.channel.get());
  const std::string object = Filled(2 << 20, 4);
  PutReply put;
  REQUIRE(stub.Put(Key("hold:a"), OutgoingBulk(object.data(), 2 << 20), &put, Within(kLong)).ok());
  // 2 MiB held: another 2 MiB does not fit in 3, 1 MiB does.
  absl::Status s = stub.Put(Key("b"), OutgoingBulk(object.data(), 2 << 20), &put, Within(kLong));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "ServerOptions::max_pulled_bytes"));
  CHECK(stub.Put(Key("c"), OutgoingBulk(object.data(), 1 << 20), &put, Within(kLong)).ok());
  store.Drop();
  CHECK(stub.Put(Key("b"), OutgoingBulk(object.data(), 2 << 20), &put, Within(kLong)).ok());
  CHECK(store.object("b") == object);
}

// Before: the call's end withdrew the payload under the server's READ, which failed, and with it
// the server's connection and every other call on it. Now the payload stays exposed until the
// server says it pulled it (or answers), within the channel's keepalive_timeout.
TEST_CASE(
    "a call given up while the server pulls its payload fails, its bytes are the caller's "
    "once it returns, and the connection survives") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  zrpc::ChannelOptions channel_options;
  channel_options.keepalive_timeout = absl::Seconds(60);  // the grace: longer than any pull here
  Served served(config, {&store}, {}, channel_options);
  ObjectStore::Stub stub(served.channel.get());
  constexpr size_t kSize = 64 << 20;
  std::string bytes = Filled(kSize, 6);
  PutReply put;
  // Given up once the server is pulling it (it has taken memory for the payload), which under
  // emulation is far sooner than a 64 MiB READ ends. A cancel: a deadline might pass before
  // the payload is even exposed, and test nothing.
  zrpc::CallOptions options = Within(kLong);
  options.cancellation = std::make_shared<zrpc::Cancellation>();
  absl::Notification done;
  absl::Status s;
  stub.AsyncPut(Key("late"), OutgoingBulk(bytes.data(), kSize), &put, options,
                [&](absl::Status status) {
                  s = std::move(status);
                  done.Notify();
                });
  REQUIRE(Eventually([&] { return served.server->stats().pulled_bytes_held > 0; }));
  options.cancellation->Cancel();
  done.WaitForNotification();
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kCancelled);
  // Returned: the server has read all of it, and reads no more.
  std::fill(bytes.begin(), bytes.end(), 'Z');
  absl::Status after =
      stub.Put(Key("after"), OutgoingBulk(bytes.data(), 1000), &put, Within(kLong));
  INFO(after);
  CHECK(after.ok());
  CHECK(store.object("after") == std::string(1000, 'Z'));
  CHECK(served.channel->stats().connections_lost == 0);
  // The server's Put of "late" runs after its READ, with what was read before the call
  // returned: never a mix with the Zs written after (it may be skipped as cancelled, too).
  CHECK(Eventually([&] { return served.server->stats().pulled_bytes_held == 0; }));
  const std::string late = store.object("late");
  CHECK((late.empty() || late == Filled(kSize, 6)));
}

TEST_CASE(
    "a payload the server has not pulled within the grace is withdrawn anyway: the "
    "server's READ fails with its connection, and the channel serves again") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  zrpc::ChannelOptions channel_options;
  channel_options.keepalive_interval = absl::Seconds(30);      // no pings in the way
  channel_options.keepalive_timeout = absl::Milliseconds(50);  // the grace: shorter than the pull
  Served served(config, {&store}, {}, channel_options);
  ObjectStore::Stub stub(served.channel.get());
  constexpr size_t kSize = 64 << 20;
  std::string bytes = Filled(kSize, 7);
  PutReply put;
  absl::Status s = stub.Put(Key("late"), OutgoingBulk(bytes.data(), kSize), &put,
                            Within(absl::Milliseconds(50)));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  // Returned: the registration is gone, so the server's NIC reads nothing more of these bytes.
  std::fill(bytes.begin(), bytes.end(), 'Z');
  // The server's READ, if it was still running, failed, and that closed the connection (the
  // price of a withdrawn registration: WIRE.md); the channel serves again on a new one.
  absl::Status after;
  for (int attempt = 0; attempt < 50; ++attempt) {
    after = stub.Put(Key("after"), OutgoingBulk(bytes.data(), 1000), &put, Within(kLong));
    if (after.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));  // through the reconnection backoff
  }
  INFO(after);
  CHECK(after.ok());
  CHECK(store.object("after") == std::string(1000, 'Z'));
  // Whatever the server got of "late" (nothing, or the whole of it if the READ won), never a
  // mix with the Zs written after the call returned.
  const std::string late = store.object("late");
  CHECK((late.empty() || late == Filled(kSize, 7)));
}

// A registered buffer with guard bands around the range a response lands in.
struct Landing {
  static constexpr size_t kGuard = 4096;
  static constexpr uint8_t kGuardByte = 0xA5;
  Landing(zrpc::ClientChannel& channel, size_t size) : bytes(size + 2 * kGuard, kGuardByte) {
    absl::StatusOr<zrpc::RegisteredMemory> registered =
        channel.RegisterMemory(bytes.data(), bytes.size());
    REQUIRE(registered.ok());
    memory = *std::move(registered);
  }
  zrpc::CallOptions Options(size_t size, absl::Duration timeout = kLong) {
    zrpc::CallOptions options = Within(timeout);
    absl::StatusOr<zrpc::BulkDestination> destination = memory.Destination(kGuard, size);
    REQUIRE(destination.ok());
    options.response_destination = *destination;
    return options;
  }
  uint8_t* range() { return bytes.data() + kGuard; }
  bool GuardsIntact(size_t size) const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (bytes[i] != kGuardByte || bytes[kGuard + size + i] != kGuardByte) return false;
    }
    return true;
  }
  std::vector<uint8_t> bytes;
  zrpc::RegisteredMemory memory;
};

TEST_CASE(
    "a response payload lands straight in the caller's registered buffer, guard bands "
    "untouched") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  // Below the arena (written there otherwise) and above it (pulled into fresh memory otherwise).
  for (size_t size : {size_t{1}, size_t{100000}, size_t{4} << 20}) {
    INFO("payload of " << size << " bytes");
    Landing landing(*served.channel, size);
    ObjectInfo info;
    IncomingBulk got;
    absl::Status s = stub.Get(Key(absl::StrCat(size, ":", 9)), &info, &got, landing.Options(size));
    INFO(s);
    REQUIRE(s.ok());
    CHECK(got.data() == landing.range());  // where the caller said, not a copy
    CHECK(got.size() == size);
    CHECK(FirstDifference(Filled(size, 9), got.view()) == "equal");
    CHECK(landing.GuardsIntact(size));
    CHECK(served.channel->stats().pulled_bytes_held == 0);  // no memory of the runtime's
    got.Reset();
    CHECK(landing.range()[0] == static_cast<uint8_t>(Filled(1, 9)[0]));  // still the caller's
  }
  // A destination larger than the payload: the payload takes its start, the rest is untouched.
  Landing roomy(*served.channel, 8192);
  ObjectInfo info;
  IncomingBulk got;
  REQUIRE(stub.Get(Key("5000:4"), &info, &got, roomy.Options(8192)).ok());
  CHECK(got.size() == 5000);
  CHECK(got.view() == Filled(5000, 4));
  CHECK(std::count(roomy.range() + 5000, roomy.range() + 8192 + Landing::kGuard,
                   Landing::kGuardByte) == 3192 + static_cast<long>(Landing::kGuard));
}

TEST_CASE("a payload larger than the caller's destination fails the call and writes nothing") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  Landing landing(*served.channel, 1000);
  ObjectInfo info;
  IncomingBulk got;
  absl::Status s = stub.Get(Key("1001:1"), &info, &got, landing.Options(1000));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "response_destination"));
  CHECK(got.empty());
  CHECK(std::count(landing.bytes.begin(), landing.bytes.end(), Landing::kGuardByte) ==
        static_cast<long>(landing.bytes.size()));
  // The limit itself fits; the connection served on.
  CHECK(stub.Get(Key("1000:1"), &info, &got, landing.Options(1000)).ok());
  CHECK(got.view() == Filled(1000, 1));
  CHECK(served.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "a call that ends while its answer lands in the caller's buffer returns only once "
    "nothing writes there any more") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  // Its READ lasts some milliseconds here (rxe copies in the kernel): the cancel lands in it.
  constexpr size_t kSize = 64 << 20;
  const std::string key = absl::StrCat(kSize, ":0");
  Landing landing(*served.channel, kSize);
  ObjectInfo info;
  IncomingBulk got;
  REQUIRE(stub.Get(Key(key), &info, &got, landing.Options(kSize)).ok());  // the server makes it
  CHECK(std::count(got.data(), got.data() + kSize, uint8_t{'c'}) == static_cast<long>(kSize));
  got.Reset();
  constexpr size_t kTail = 64 << 10;

  // Cancelled the moment the READ into the caller's buffer is under way.
  zrpc::CallOptions options = landing.Options(kSize);
  options.cancellation = std::make_shared<zrpc::Cancellation>();
  absl::Notification done;
  absl::Status status;
  uint64_t reads_at_done = 0;
  stub.AsyncGet(Key(key), &info, &got, options, [&](absl::Status s) {
    // What the runtime still reads into the caller's buffer as the caller gets it back.
    reads_at_done = served.channel->stats().bulk_reads_in_flight;
    status = std::move(s);
    done.Notify();
  });
  // Polled tightly: the READ lasts only milliseconds here.
  REQUIRE(Eventually([&] { return served.channel->stats().bulk_reads_in_flight > 0; },
                     absl::Seconds(30), absl::Microseconds(200)));
  options.cancellation->Cancel();
  const absl::Time cancelled = absl::Now();
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // The caller reuses its buffer at once; nothing lands in it afterwards. Its end first: a READ
  // still under way writes there last.
  std::fill(landing.range() + kSize - kTail, landing.range() + kSize, uint8_t{'Z'});
  INFO(status << ", " << absl::Now() - cancelled << " after the cancel");
  CHECK((status.code() == absl::StatusCode::kCancelled || status.ok()));  // a READ may win
  CHECK(reads_at_done == 0);  // done came after the READ
  got.Reset();
  absl::SleepFor(absl::Seconds(1));
  CHECK(std::count(landing.range() + kSize - kTail, landing.range() + kSize, uint8_t{'Z'}) ==
        static_cast<long>(kTail));
  CHECK(landing.GuardsIntact(kSize));

  // Deadlines, wherever they fall (before the answer, during the READ, after it): the same.
  for (absl::Duration timeout : {absl::Milliseconds(300), absl::Seconds(1)}) {
    absl::Status s = stub.Get(Key(key), &info, &got, landing.Options(kSize, timeout));
    INFO(s);
    CHECK((s.ok() || s.code() == absl::StatusCode::kDeadlineExceeded));
    got.Reset();
    std::fill(landing.range() + kSize - kTail, landing.range() + kSize, uint8_t{'Y'});
    absl::SleepFor(absl::Seconds(1));
    CHECK(std::count(landing.range() + kSize - kTail, landing.range() + kSize, uint8_t{'Y'}) ==
          static_cast<long>(kTail));
  }
  CHECK(served.channel->stats().pulled_bytes_held == 0);
  CHECK(served.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "a response destination is refused for a method without a response payload, and from "
    "another device") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  Landing landing(*served.channel, 4096);
  PutReply put;
  const std::string bytes(10, 'x');
  absl::Status s =
      stub.Put(Key("x"), OutgoingBulk(bytes.data(), bytes.size()), &put, landing.Options(4096));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "without response_bulk"));

  zrpc::ChannelOptions other_options;
  other_options.device = config;
  other_options.slots.slot_count = 512;  // another device object: another protection domain
  auto other =
      zrpc::CreateChannel(absl::StrCat(config.addr, ":", served.server->port()), other_options);
  REQUIRE(other.ok());
  Landing foreign(**other, 4096);
  ObjectInfo info;
  IncomingBulk got;
  s = stub.Get(Key("10:1"), &info, &got, foreign.Options(4096));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "another device"));
}

// A client that keeps a response payload's key after it said pulled, and READs through it: the
// server's NIC refuses (the registration was for that call only), the rogue's connection fails,
// and everyone else is served as before.
TEST_CASE(
    "a peer that READs an exposed payload after saying it pulled it gets a remote access "
    "error and loses its connection; other clients are unaffected") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  zrpc::testing::TransportPeer peer(config);
  zrpc::testing::Recorder rogue;
  auto connection = peer.Connect(config.addr, served.server->port(), &rogue);
  REQUIRE(connection.ok());
  auto send = [&](zrpc::RpcHeader header, const std::string& body) {
    auto buffer = (*connection)->AcquireSendBuffer();
    REQUIRE(buffer.ok());
    zrpc::EncodeRpcHeader(header, buffer->data);
    std::memcpy(buffer->data + zrpc::RpcHeader::kSize, body.data(), body.size());
    REQUIRE((*connection)
                ->Send(*buffer, static_cast<uint32_t>(zrpc::RpcHeader::kSize + body.size()), 0)
                .ok());
  };
  // A Get (method 1) asking for its response payload exposed (as a response_destination does).
  constexpr size_t kSize = 8192;
  zrpc::RpcHeader get = zrpc::RpcHeader::Request(
      zrpc::ServiceId(ObjectStore::service_info().full_name), 1, /*call_id=*/1, 0);
  get.flags |= zrpc::kRpcFlagPullResponse;
  send(get, Key(absl::StrCat(kSize, ":", 31)).SerializeAsString());
  REQUIRE(rogue.WaitFor(
      [&]() ABSL_SHARED_LOCKS_REQUIRED(rogue.mu) { return rogue.messages.size() == 1; }));
  std::string answer;
  {
    absl::MutexLock lock(&rogue.mu);
    answer = rogue.messages[0];
  }
  const auto bytes =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(answer.data()), answer.size());
  absl::StatusOr<zrpc::RpcHeader> header = zrpc::DecodeRpcHeader(bytes);
  REQUIRE(header.ok());
  REQUIRE(header->kind == zrpc::RpcKind::kResponse);
  REQUIRE(header->pulls());
  absl::StatusOr<zrpc::MessageLayout> layout = zrpc::DecodeLayout(*header, bytes);
  REQUIRE(layout.ok());
  REQUIRE(layout->pull_count == 1);
  const zrpc::transport::RemoteRange range{layout->pulls[0].addr, layout->pulls[0].rkey};

  std::vector<uint8_t> sink(kSize);
  auto local = peer.device->RegisterMemory(sink.data(), sink.size());
  REQUIRE(local.ok());
  const zrpc::transport::BulkSource into{sink.data(), static_cast<uint32_t>(kSize),
                                         (*local)->lkey()};
  // While exposed, the key is good: the payload is the one asked for.
  REQUIRE((*connection)->ReadBulk(into, range, 100).ok());
  REQUIRE(rogue.WaitFor(
      [&]() ABSL_SHARED_LOCKS_REQUIRED(rogue.mu) { return rogue.done.count(100) == 1; }));
  {
    absl::MutexLock lock(&rogue.mu);
    REQUIRE(rogue.done[100].ok());
  }
  CHECK(FirstDifference(absl::string_view(reinterpret_cast<const char*>(sink.data()), kSize),
                        Filled(kSize, 31)) == "equal");
  // Pulled, then a keepalive ping: the server handles both in order, so once the ping is
  // answered the payload's registration is gone.
  send(zrpc::RpcHeader::Pulled(1, layout->pulls[0].addr), "");
  send(zrpc::RpcHeader::Request(zrpc::internal::kKeepaliveServiceId, 0, /*call_id=*/2, 0), "");
  REQUIRE(rogue.WaitFor(
      [&]() ABSL_SHARED_LOCKS_REQUIRED(rogue.mu) { return rogue.messages.size() == 2; }));
  // The second READ lands, if anywhere, in memory of its own, zeroed: nothing may arrive there.
  std::vector<uint8_t> after(kSize, 0);
  auto after_region = peer.device->RegisterMemory(after.data(), after.size());
  REQUIRE(after_region.ok());
  const zrpc::transport::BulkSource into_after{after.data(), static_cast<uint32_t>(kSize),
                                               (*after_region)->lkey()};
  REQUIRE((*connection)->ReadBulk(into_after, range, 101).ok());
  REQUIRE(rogue.WaitFor(
      [&]() ABSL_SHARED_LOCKS_REQUIRED(rogue.mu) { return rogue.closed.has_value(); }));
  {
    absl::MutexLock lock(&rogue.mu);
    INFO(rogue.done[101]);
    CHECK_FALSE(rogue.done[101].ok());
    // The server's NIC NAKs the READ and the server, whose QP the refusal put in error, hangs
    // up. rxe hands this side the NAK's completion (its completer) and the disconnect (the
    // connection manager) on separate paths, in either order: the connection closes with the
    // remote access error or, when the disconnect is applied first (the QP is then flushed),
    // with the peer's disconnect. Both mean the READ failed; what matters is that it read
    // nothing.
    INFO(*rogue.closed);
    CHECK((absl::StrContains(rogue.closed->message(), "remote access error") ||
           zrpc::transport::IsPeerDisconnect(*rogue.closed)));
  }
  CHECK(std::all_of(after.begin(), after.end(), [](uint8_t b) { return b == 0; }));
  // The server, and its other clients, carry on.
  ObjectInfo info;
  IncomingBulk got;
  REQUIRE(stub.Get(Key("100:3"), &info, &got, Within(kLong)).ok());
  CHECK(got.view() == Filled(100, 3));
  CHECK(served.channel->stats().connections_lost == 0);
  connection->reset();
  peer.poller->Shutdown();
}

// Mercury's "the handler's memory": a server that keeps objects in a region of its own has
// request payloads past its arena READ straight there.
class PlacingStore : public ObjectStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const ObjectKey& key, IncomingBulk bulk,
                   PutReply* reply) override {
    absl::MutexLock lock(&mu);
    landed[key.name()] = bulk.data();
    objects[key.name()] = std::string(bulk.view());
    reply->set_stored_bytes(bulk.size());
    return absl::OkStatus();  // `bulk` released on return: the placement's release runs
  }
  absl::Mutex mu;
  std::map<std::string, const uint8_t*> landed;
  std::map<std::string, std::string> objects;
};

TEST_CASE(
    "a server places request payloads it pulls in memory it chose, read in place there; "
    "a refusal, memory too small or from elsewhere fail the call, and every placement is "
    "released") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  PlacingStore store;
  constexpr size_t kRegion = 8 << 20;
  std::vector<uint8_t> region(kRegion);
  std::atomic<int> placed{0}, released{0};
  std::atomic<size_t> next_offset{0};
  std::atomic<int> mode{0};  // 0: place; 1: refuse; 2: too small; 3: another device's memory
  std::unique_ptr<zrpc::RegisteredMemory> memory;
  std::unique_ptr<zrpc::RegisteredMemory> foreign;
  zrpc::ServerOptions options;
  options.place_request_payload = [&](const zrpc::MethodInfo& method,
                                      size_t size) -> absl::StatusOr<zrpc::PayloadPlacement> {
    CHECK(std::string(method.full_name) == "zrpc.examples.ObjectStore/Put");
    if (mode == 1) return absl::PermissionDeniedError("no room for you");
    placed.fetch_add(1);
    zrpc::PayloadPlacement placement;
    placement.release = [&] { released.fetch_add(1); };
    absl::StatusOr<zrpc::BulkDestination> destination =
        mode == 3 ? foreign->Destination(0, size)
                  : memory->Destination(next_offset.fetch_add(size), mode == 2 ? size - 1 : size);
    if (!destination.ok()) return destination.status();
    placement.destination = *destination;
    return placement;
  };
  zrpc::ChannelOptions channel_options;
  channel_options.slots.slot_size = 8192;  // other slots: the channel's own device (and PD)
  Served served(config, {&store}, options, channel_options);
  absl::StatusOr<zrpc::RegisteredMemory> registered =
      served.server->RegisterMemory(region.data(), region.size());
  REQUIRE(registered.ok());
  memory = std::make_unique<zrpc::RegisteredMemory>(*std::move(registered));
  // Registered by the channel, on its own device: the server's NIC cannot write there.
  std::vector<uint8_t> elsewhere(kRegion);
  absl::StatusOr<zrpc::RegisteredMemory> other =
      served.channel->RegisterMemory(elsewhere.data(), elsewhere.size());
  REQUIRE(other.ok());
  foreign = std::make_unique<zrpc::RegisteredMemory>(*std::move(other));
  ObjectStore::Stub stub(served.channel.get());
  PutReply put;

  // Past the arena: placed, and read in place there.
  const std::string big = Filled(1 << 20, 41);
  REQUIRE(stub.Put(Key("big"), OutgoingBulk::Copy(big), &put, Within(kLong)).ok());
  {
    absl::MutexLock lock(&store.mu);
    CHECK(store.landed["big"] == region.data());
    CHECK(FirstDifference(store.objects["big"], big) == "equal");
  }
  CHECK(std::memcmp(region.data(), big.data(), big.size()) == 0);
  CHECK(Eventually([&] { return released == 1; }));
  CHECK(served.server->stats().pulled_bytes_held == 0);  // none of the runtime's memory
  // Within the arena: written there, not placed.
  REQUIRE(stub.Put(Key("small"), OutgoingBulk::Copy(Filled(1000, 42)), &put, Within(kLong)).ok());
  CHECK(placed == 1);

  struct Refusal {
    int mode;
    absl::StatusCode code;
    const char* says;
  };
  for (const Refusal& r :
       {Refusal{1, absl::StatusCode::kPermissionDenied, "no room for you"},
        Refusal{2, absl::StatusCode::kResourceExhausted, "gave 1048575 bytes"},
        Refusal{3, absl::StatusCode::kFailedPrecondition, "not registered on this server"}}) {
    INFO("mode " << r.mode);
    mode = r.mode;
    absl::Status s = stub.Put(Key("refused"), OutgoingBulk::Copy(big), &put, Within(kLong));
    INFO(s);
    CHECK(s.code() == r.code);
    CHECK(absl::StrContains(s.message(), r.says));
  }
  // Every placement handed out was given back (the refused ones at once).
  CHECK(Eventually([&] { return released == placed; }));
  mode = 0;
  REQUIRE(stub.Put(Key("again"), OutgoingBulk::Copy(big), &put, Within(kLong)).ok());
  CHECK(Eventually([&] { return released == placed; }));
  CHECK(served.channel->stats().connections_lost == 0);
}

// Before: an answer (here a refusal before any READ) did not withdraw the request's exposed
// payload; the call ended only when the grace (keepalive_timeout, 60 s here) ran out.
TEST_CASE(
    "a call whose pulled request the server refuses ends with the answer, not after the "
    "grace") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  zrpc::ServerOptions server_options;
  server_options.max_bulk_size = 1 << 20;
  zrpc::ChannelOptions channel_options;
  channel_options.keepalive_timeout = absl::Seconds(60);
  Served served(config, {&store}, server_options, channel_options);
  ObjectStore::Stub stub(served.channel.get());
  const std::string object = Filled(2 << 20, 8);
  PutReply put;
  absl::Notification done;
  absl::Status s;
  bool released = false;
  stub.AsyncPut(Key("refused"),
                OutgoingBulk(object.data(), object.size(), [&] { released = true; }), &put,
                Within(absl::Seconds(120)), [&](absl::Status status) {
                  s = std::move(status);
                  done.Notify();
                });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "ServerOptions::max_bulk_size"));
  CHECK(released);
  CHECK(served.channel->stats().connections_lost == 0);
}

}  // namespace
