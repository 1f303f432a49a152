// Bulk payloads from memory the application registered (rpc/registered_memory.h), on a real
// device (tag "rdma"; tools/test runs it inside tools/softroce): sent with no copy, counted
// apart from staged bytes, byte-checked; and a call never ends while the runtime may still read
// its payload, whether the payload was staged, deferred or zero-copy.
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
#include "rpc/registered_memory.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/log_capture.h"
#include "tests/pattern.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::IncomingBulk;
using zrpc::OutgoingBulk;
using zrpc::RegisteredMemory;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::examples::PutReply;
using zrpc::testing::Fill;
using zrpc::testing::Key;
using zrpc::testing::kLong;
using zrpc::testing::Served;
using zrpc::testing::Within;

// Answers Get from memory registered on its server ("<offset>:<size>" of it).
class Store : public zrpc::testing::KeepingStore {
 public:
  absl::Status Get(zrpc::ServerContext&, const ObjectKey& key, ObjectInfo* info,
                   OutgoingBulk* bulk) override {
    const size_t colon = key.name().find(':');
    const size_t offset = std::stoul(key.name().substr(0, colon));
    const size_t size = std::stoul(key.name().substr(colon + 1));
    absl::StatusOr<OutgoingBulk> out =
        memory->Bulk(offset, size, [this] { get_releases.fetch_add(1); });
    if (!out.ok()) return out.status();
    info->set_size(size);
    *bulk = *std::move(out);
    return absl::OkStatus();
  }

  RegisteredMemory* memory = nullptr;
  std::atomic<int> get_releases{0};
};

TEST_CASE("a request payload from registered memory is sent with no copy") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  constexpr size_t kSize = 100 << 10;
  std::vector<uint8_t> bytes(kSize);
  Fill(bytes.data(), kSize, 7);
  absl::StatusOr<RegisteredMemory> memory =
      served.channel->RegisterMemory(bytes.data(), bytes.size());
  INFO(memory.status());
  REQUIRE(memory.ok());
  CHECK(memory->size() == kSize);

  std::atomic<int> released{0};
  absl::StatusOr<OutgoingBulk> bulk = memory->Bulk(0, kSize, [&] { released.fetch_add(1); });
  REQUIRE(bulk.ok());
  CHECK(bulk->registered());
  PutReply reply;
  absl::Status s = stub.Put(Key("a"), *std::move(bulk), &reply, Within(kLong));
  INFO(s);
  REQUIRE(s.ok());
  CHECK(released.load() == 1);  // before the call returned
  CHECK(reply.stored_bytes() == kSize);
  CHECK(store.object("a") == std::string(bytes.begin(), bytes.end()));
  const zrpc::ChannelStats stats = served.channel->stats();
  CHECK(stats.bulk_bytes_zero_copy == kSize);
  CHECK(stats.bulk_bytes_staged == 0);
  CHECK(stats.staging_bytes_registered == 0);  // no staging buffer was ever registered

  // A slice from the middle, to its last byte.
  bulk = memory->Bulk(kSize - 4097, 4097);
  REQUIRE(bulk.ok());
  s = stub.Put(Key("tail"), *std::move(bulk), &reply, Within(kLong));
  REQUIRE(s.ok());
  CHECK(store.object("tail") == std::string(bytes.end() - 4097, bytes.end()));
  CHECK(served.channel->stats().bulk_bytes_zero_copy == kSize + 4097);
}

TEST_CASE("one registered buffer is sent 1,000 times with its one registration") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  constexpr size_t kSize = 16 << 10;
  constexpr int kCalls = 1000;
  std::vector<uint8_t> bytes(kSize);
  absl::StatusOr<RegisteredMemory> memory =
      served.channel->RegisterMemory(bytes.data(), bytes.size());
  REQUIRE(memory.ok());
  std::atomic<int> released{0};
  for (int i = 0; i < kCalls; ++i) {
    Fill(bytes.data(), kSize, i);  // the caller may rewrite its bytes once the call returned
    absl::StatusOr<OutgoingBulk> bulk = memory->Bulk(0, kSize, [&] { released.fetch_add(1); });
    REQUIRE(bulk.ok());
    PutReply reply;
    absl::Status s = stub.Put(Key("same"), *std::move(bulk), &reply, Within(kLong));
    INFO(i << ": " << s);
    REQUIRE(s.ok());
    if (i % 97 == 0 || i == kCalls - 1) {
      REQUIRE(store.object("same") == std::string(bytes.begin(), bytes.end()));
    }
  }
  CHECK(released.load() == kCalls);
  const zrpc::ChannelStats stats = served.channel->stats();
  CHECK(stats.bulk_bytes_zero_copy == uint64_t{kSize} * kCalls);
  CHECK(stats.bulk_bytes_staged == 0);
  CHECK(stats.staging_bytes_registered == 0);
}

TEST_CASE("unregistered bytes are staged, and counted as staged") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  const std::string bytes = zrpc::testing::Filled(10000, 3);
  PutReply reply;
  REQUIRE(stub.Put(Key("b"), OutgoingBulk(bytes.data(), bytes.size()), &reply, Within(kLong)).ok());
  CHECK(store.object("b") == bytes);
  const zrpc::ChannelStats stats = served.channel->stats();
  CHECK(stats.bulk_bytes_staged == bytes.size());
  CHECK(stats.bulk_bytes_zero_copy == 0);
  CHECK(stats.staging_bytes_registered > 0);
}

TEST_CASE("a response payload from the server's registered memory is sent with no copy") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  constexpr size_t kSize = 200 << 10;
  std::vector<uint8_t> bytes(kSize);
  Fill(bytes.data(), kSize, 21);
  absl::StatusOr<RegisteredMemory> memory = served.server->RegisterMemory(bytes.data(), kSize);
  REQUIRE(memory.ok());
  store.memory = &*memory;
  ObjectStore::Stub stub(served.channel.get());
  ObjectInfo info;
  IncomingBulk got;
  absl::Status s = stub.Get(Key(absl::StrCat(1000, ":", 150000)), &info, &got, Within(kLong));
  INFO(s);
  REQUIRE(s.ok());
  CHECK(got.view() ==
        absl::string_view(reinterpret_cast<const char*>(bytes.data()) + 1000, 150000));
  got.Reset();
  // The server counts the payload and releases it when its WRITE's completion reaches the
  // server's poller, which may be after the client has the answer (sent behind the WRITE, but
  // acknowledged on its own): wait for it.
  CHECK(zrpc::testing::Eventually([&] {
    return served.server->stats().bulk_bytes_zero_copy == 150000 && store.get_releases.load() == 1;
  }));
  const zrpc::ServerStats stats = served.server->stats();
  CHECK(stats.bulk_bytes_zero_copy == 150000);
  CHECK(stats.bulk_bytes_staged == 0);
  CHECK(stats.staging_bytes_registered == 0);
  CHECK(store.get_releases.load() == 1);  // released once, at the WRITE's completion
  // A range the handler gets wrong fails that call, and only that call.
  s = stub.Get(Key(absl::StrCat(kSize - 10, ":", 11)), &info, &got, Within(kLong));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "registered bytes"));
  s = stub.Get(Key("0:4096"), &info, &got, Within(kLong));
  CHECK(s.ok());
}

TEST_CASE("RegisteredMemory::Bulk refuses ranges outside the registration") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  std::vector<uint8_t> bytes(8192);
  absl::StatusOr<RegisteredMemory> memory = served.channel->RegisterMemory(bytes.data(), 8192);
  REQUIRE(memory.ok());
  CHECK(memory->Bulk(0, 8192).ok());  // all of it
  CHECK(memory->Bulk(8191, 1).ok());  // the last byte
  for (auto [offset, size] : std::vector<std::pair<size_t, size_t>>{
           {0, 8193}, {8191, 2}, {8192, 1}, {0, 0}, {1, SIZE_MAX}, {SIZE_MAX, 2}}) {
    absl::StatusOr<OutgoingBulk> bulk = memory->Bulk(offset, size);
    INFO(offset << "+" << size);
    CHECK(bulk.status().code() == absl::StatusCode::kInvalidArgument);
  }
  RegisteredMemory moved = *std::move(memory);
  CHECK(memory->Bulk(0, 1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(served.channel->RegisterMemory(nullptr, 10).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(served.channel->RegisterMemory(bytes.data(), 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("memory registered on another device is staged, with one warning") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  // Other slot options: another device object, another protection domain.
  zrpc::ChannelOptions other_options;
  other_options.device = config;
  other_options.slots.slot_count = 512;
  absl::StatusOr<std::unique_ptr<zrpc::ClientChannel>> other =
      zrpc::CreateChannel(absl::StrCat(config.addr, ":", served.server->port()), other_options);
  REQUIRE(other.ok());
  std::vector<uint8_t> bytes(5000);
  Fill(bytes.data(), bytes.size(), 5);
  absl::StatusOr<RegisteredMemory> memory = (*other)->RegisterMemory(bytes.data(), bytes.size());
  REQUIRE(memory.ok());
  zrpc::testing::LogCapture log(zrpc::LogLevel::kWarning);
  ObjectStore::Stub stub(served.channel.get());
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<OutgoingBulk> bulk = memory->Bulk(0, bytes.size());
    REQUIRE(bulk.ok());
    PutReply reply;
    REQUIRE(stub.Put(Key("c"), *std::move(bulk), &reply, Within(kLong)).ok());
    CHECK(store.object("c") == std::string(bytes.begin(), bytes.end()));
  }
  CHECK(served.channel->stats().bulk_bytes_staged == 3 * bytes.size());
  CHECK(served.channel->stats().bulk_bytes_zero_copy == 0);
  CHECK(log.Count(zrpc::LogLevel::kWarning, "client", "registered on another device") == 1);
}

TEST_CASE("a registration outlives its handle while payloads from it are in flight") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store});
  ObjectStore::Stub stub(served.channel.get());
  constexpr size_t kSize = 64 << 10;
  std::vector<uint8_t> bytes(kSize);
  Fill(bytes.data(), kSize, 9);
  constexpr int kCalls = 8;
  absl::Notification all_done;
  std::atomic<int> done{0};
  std::atomic<int> ok{0};
  std::vector<PutReply> replies(kCalls);
  {
    absl::StatusOr<RegisteredMemory> memory = served.channel->RegisterMemory(bytes.data(), kSize);
    REQUIRE(memory.ok());
    for (int i = 0; i < kCalls; ++i) {
      absl::StatusOr<OutgoingBulk> bulk = memory->Bulk(0, kSize);
      REQUIRE(bulk.ok());
      stub.AsyncPut(Key(absl::StrCat("d", i)), *std::move(bulk), &replies[i], Within(kLong),
                    [&](absl::Status s) {
                      if (s.ok()) ok.fetch_add(1);
                      if (done.fetch_add(1) + 1 == kCalls) all_done.Notify();
                    });
    }
  }  // the handle goes while the calls are in flight
  REQUIRE(all_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(ok.load() == kCalls);
  for (int i = 0; i < kCalls; ++i) {
    CHECK(store.object(absl::StrCat("d", i)) == std::string(bytes.begin(), bytes.end()));
  }
  CHECK(served.channel->stats().connections_lost == 0);
}

// What a call's payload release and its `done` saw of each other.
struct Outcome {
  std::atomic<bool> released{false};
  std::atomic<bool> released_before_done{false};
  absl::Status status;
  absl::Notification done;
};

void PutAsync(ObjectStore::Stub& stub, const std::string& name, OutgoingBulk bulk,
              absl::Duration timeout, PutReply* reply, Outcome* outcome) {
  stub.AsyncPut(Key(name), std::move(bulk), reply, Within(timeout), [outcome](absl::Status s) {
    outcome->released_before_done = outcome->released.load();
    outcome->status = std::move(s);
    outcome->done.Notify();
  });
}

// The server's arena holds one payload; its handler keeps the first ("hold"), so what follows
// waits for arena space the server never frees while the test runs.
constexpr size_t kPayload = 64 << 10;

zrpc::ServerOptions OneArenaServer() {
  zrpc::ServerOptions options;
  options.listener.connection.arena_size = kPayload;
  return options;
}

TEST_CASE(
    "a call whose zero-copy payload waits for the server's arena ends at its deadline, "
    "payload taken back first") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store}, OneArenaServer());
  ObjectStore::Stub stub(served.channel.get());
  std::vector<uint8_t> bytes(2 * kPayload);
  Fill(bytes.data(), bytes.size(), 13);
  absl::StatusOr<RegisteredMemory> memory =
      served.channel->RegisterMemory(bytes.data(), bytes.size());
  REQUIRE(memory.ok());
  PutReply reply;
  REQUIRE(stub.Put(Key("hold"), *memory->Bulk(0, kPayload), &reply, Within(kLong)).ok());

  Outcome late;
  PutReply late_reply;
  const absl::Time start = absl::Now();
  absl::StatusOr<OutgoingBulk> bulk =
      memory->Bulk(kPayload, kPayload, [&late] { late.released = true; });
  REQUIRE(bulk.ok());
  PutAsync(stub, "late", *std::move(bulk), absl::Milliseconds(300), &late_reply, &late);
  REQUIRE(late.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(absl::Now() - start < absl::Seconds(3));  // at its deadline, not when space came
  INFO(late.status);
  CHECK(late.status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(late.released_before_done.load());
  // The caller owns its bytes again: what it writes there now never reaches the server.
  Fill(bytes.data() + kPayload, kPayload, 99);

  store.Drop();  // arena space comes back; the withdrawn payload and request never went
  PutReply after;
  absl::Status s = stub.Put(Key("after"), *memory->Bulk(0, kPayload), &after, Within(kLong));
  INFO(s);
  CHECK(s.ok());
  CHECK(store.puts.load() == 2);  // "hold" and "after": "late" was taken back, not sent
  CHECK(store.object("late").empty());
  CHECK(served.channel->stats().connections_lost == 0);
  CHECK(served.channel->stats().bulk_bytes_zero_copy == 2 * kPayload);
}

TEST_CASE(
    "a call whose staged payload waits behind the connection's quota ends at its "
    "deadline, payload released first") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Store store;
  Served served(config, {&store}, OneArenaServer());
  ObjectStore::Stub stub(served.channel.get());
  const std::string bytes = zrpc::testing::Filled(kPayload, 17);
  PutReply reply;
  REQUIRE(stub.Put(Key("hold"), OutgoingBulk(bytes.data(), kPayload), &reply, Within(kLong)).ok());
  // The second is staged and its WRITE waits for the arena, holding the connection's staging
  // quota (one arena's worth); the third waits for the quota, its bytes still the caller's.
  Outcome second;
  Outcome third;
  PutReply second_reply;
  PutReply third_reply;
  PutAsync(stub, "second", OutgoingBulk(bytes.data(), kPayload, [&] { second.released = true; }),
           kLong, &second_reply, &second);
  PutAsync(stub, "third", OutgoingBulk(bytes.data(), kPayload, [&] { third.released = true; }),
           absl::Milliseconds(300), &third_reply, &third);
  REQUIRE(third.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  INFO(third.status);
  CHECK(third.status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(third.released_before_done.load());
  CHECK(second.released.load());  // staged: released as soon as it was copied
  CHECK_FALSE(second.done.HasBeenNotified());

  store.Drop();
  REQUIRE(second.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(second.status.ok());
  CHECK(store.object("second") == bytes);
  CHECK(store.object("third").empty());
  CHECK(served.channel->stats().connections_lost == 0);
}

}  // namespace
