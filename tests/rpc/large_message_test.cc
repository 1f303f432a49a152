// Messages larger than a slot (rpc/WIRE.md, "Messages larger than a slot"), on a real device
// (tag "rdma"; tools/test runs it inside tools/softroce): the body travels at the front of a
// payload, written into the peer's arena or pulled by it, with nothing for the user to set.
// Both ways, byte-checked, at and one past max_message_size on each side, beside bulk payloads
// (staged and registered, written and pulled), into a caller's response_destination, and with a
// call given up while the server pulls.
#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/channel.h"
#include "rpc/registered_memory.h"
#include "rpc/server.h"
#include "tests/device_counters.h"
#include "tests/eventually.h"
#include "tests/pattern.h"
#include "tests/rdma_device.h"
#include "tests/rpc/large.zrpc.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::IncomingBulk;
using zrpc::OutgoingBulk;
using zrpc::testing::Blob;
using zrpc::testing::Filled;
using zrpc::testing::FirstDifference;
using zrpc::testing::kLong;
using zrpc::testing::Large;
using zrpc::testing::Served;
using zrpc::testing::Within;

constexpr size_t kMiB = size_t{1} << 20;

class LargeService : public Large::Service {
 public:
  absl::Status Echo(zrpc::ServerContext&, const Blob& request, Blob* reply) override {
    echoes.fetch_add(1);
    Answer(request, reply);
    return absl::OkStatus();
  }
  absl::Status EchoBulk(zrpc::ServerContext&, const Blob& request, IncomingBulk bulk, Blob* reply,
                        OutgoingBulk* reply_bulk) override {
    echoes.fetch_add(1);
    Answer(request, reply);
    if (!bulk.empty()) *reply_bulk = OutgoingBulk::Copy(std::string(bulk.view()));
    return absl::OkStatus();
  }
  std::atomic<int> echoes{0};

 private:
  static void Answer(const Blob& request, Blob* reply) {
    if (request.reply_size() == 0) {
      reply->set_data(request.data());
    } else {
      reply->set_data(Filled(request.reply_size(), request.reply_seed()));
    }
  }
};

Blob Data(size_t size, uint64_t seed) {
  Blob blob;
  blob.set_data(Filled(size, seed));
  return blob;
}

// A Blob whose serialized size is exactly `size`: a tag, the length, the data.
Blob OfSerializedSize(size_t size) {
  size_t data = size - 2;
  while (1 + google::protobuf::io::CodedOutputStream::VarintSize64(data) + data > size) --data;
  Blob blob;
  blob.set_data(std::string(data, 'm'));
  REQUIRE(blob.ByteSizeLong() == size);
  return blob;
}

TEST_CASE("messages past a slot, past the arena and at 4 MiB travel both ways, byte-checked") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  Served served(config, {&service});
  Large::Stub stub(served.channel.get());
  // Just past a slot, 100 KiB (written into the arena), just past the arena and 4 MiB less a
  // little (pulled).
  const size_t sizes[] = {4096 - 40 + 1, 100 * 1024, 256 * 1024 + 1, 4 * kMiB - 64};
  uint64_t seed = 1;
  for (size_t size : sizes) {
    INFO("a " << size << "-byte request echoed");
    const Blob request = Data(size, ++seed);
    Blob reply;
    absl::Status s = stub.Echo(request, &reply, Within(kLong));
    INFO(s);
    REQUIRE(s.ok());
    CHECK(FirstDifference(reply.data(), request.data()) == "equal");
  }
  for (size_t size : sizes) {
    // One way at a time: a small request with a large answer, and the reverse.
    INFO("a " << size << "-byte answer to a small request");
    Blob request;
    request.set_reply_size(size);
    request.set_reply_seed(++seed);
    Blob reply;
    REQUIRE(stub.Echo(request, &reply, Within(kLong)).ok());
    CHECK(FirstDifference(reply.data(), Filled(size, seed)) == "equal");
    request = Data(size, ++seed);
    request.set_reply_size(3);
    request.set_reply_seed(seed);
    REQUIRE(stub.Echo(request, &reply, Within(kLong)).ok());
    CHECK(reply.data() == Filled(3, seed));
  }
  // Nothing held once the calls are over: pulled bodies are given back after parsing (the
  // client's) or when the call finishes (the server's, which may come after the answer).
  CHECK(served.channel->stats().pulled_bytes_held == 0);
  CHECK(zrpc::testing::Eventually([&] { return served.server->stats().pulled_bytes_held == 0; }));
}

TEST_CASE(
    "max_message_size: at the limit both ways; one byte past it fails RESOURCE_EXHAUSTED "
    "naming the side's option, on the sender before sending, on the receiver unread") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  SECTION("the defaults (4 MiB): a sender's own limit") {
    Served served(config, {&service});
    Large::Stub stub(served.channel.get());
    const size_t limit = 4 * kMiB;
    Blob request = OfSerializedSize(limit);
    Blob reply;
    absl::Status s = stub.Echo(request, &reply, Within(kLong));
    INFO(s);
    REQUIRE(s.ok());  // the echo is at the limit too
    CHECK(reply.data() == request.data());

    const int echoes = service.echoes.load();
    request = OfSerializedSize(limit + 1);
    s = stub.Echo(request, &reply, Within(kLong));
    INFO(s);
    CHECK(s.code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(s.message(),
                            "a 4194305-byte request exceeds the 4194304 bytes "
                            "ChannelOptions::max_message_size allows"));
    CHECK(service.echoes.load() == echoes);  // never sent

    // An answer one past the server's limit: the server says so instead.
    Blob small;
    small.set_reply_size(OfSerializedSize(limit + 1).data().size());
    s = stub.Echo(small, &reply, Within(kLong));
    INFO(s);
    CHECK(s.code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(s.message(),
                            "zrpc.testing.Large/Echo: a 4194305-byte response "
                            "exceeds the 4194304 bytes ServerOptions::max_message_size"));
    CHECK(service.echoes.load() == echoes + 1);
  }
  SECTION("a limit of 0 or past protobuf's 2 GiB - 1 is refused, naming the option") {
    for (uint64_t bad : {uint64_t{0}, uint64_t{1} << 31}) {
      zrpc::ServerOptions server_options;
      server_options.device = config;
      server_options.max_message_size = bad;
      absl::StatusOr<std::unique_ptr<zrpc::Server>> server = zrpc::Server::Create(server_options);
      CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(absl::StrContains(server.status().message(), "ServerOptions::max_message_size"));
      zrpc::ChannelOptions channel_options;
      channel_options.device = config;
      channel_options.max_message_size = bad;
      absl::StatusOr<std::unique_ptr<zrpc::ClientChannel>> channel =
          zrpc::CreateChannel(absl::StrCat(config.addr, ":1"), channel_options);
      CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(absl::StrContains(channel.status().message(), "ChannelOptions::max_message_size"));
    }
  }
  SECTION("a receiver's limit, lower than the sender's: refused before it is read") {
    zrpc::ServerOptions server_options;
    server_options.max_message_size = kMiB;
    zrpc::ChannelOptions channel_options;
    channel_options.max_message_size = 2 * kMiB;
    Served served(config, {&service}, server_options, channel_options);
    Large::Stub stub(served.channel.get());
    Blob reply;
    REQUIRE(stub.Echo(OfSerializedSize(kMiB), &reply, Within(kLong)).ok());
    const int echoes = service.echoes.load();
    absl::Status s = stub.Echo(OfSerializedSize(kMiB + 1), &reply, Within(kLong));
    INFO(s);
    CHECK(s.code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(s.message(),
                            "a 1048577-byte request exceeds the 1048576 bytes "
                            "ServerOptions::max_message_size allows"));
    CHECK(service.echoes.load() == echoes);
    CHECK(served.server->stats().pulled_bytes_held == 0);  // refused before any was taken
  }
  SECTION("a channel's receive limit: the answer is refused unread, the connection kept") {
    zrpc::ChannelOptions channel_options;
    channel_options.max_message_size = kMiB;
    Served served(config, {&service}, {}, channel_options);
    Large::Stub stub(served.channel.get());
    Blob request;
    request.set_reply_size(OfSerializedSize(kMiB).data().size());
    Blob reply;
    REQUIRE(stub.Echo(request, &reply, Within(kLong)).ok());
    request.set_reply_size(OfSerializedSize(kMiB + 1).data().size());
    absl::Status s = stub.Echo(request, &reply, Within(kLong));
    INFO(s);
    CHECK(s.code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(s.message(),
                            "a 1048577-byte response exceeds the 1048576 bytes "
                            "ChannelOptions::max_message_size allows"));
    request.set_reply_size(10);
    REQUIRE(stub.Echo(request, &reply, Within(kLong)).ok());
    CHECK(served.channel->stats().connections_lost == 0);
    CHECK(served.channel->stats().pulled_bytes_held == 0);
  }
}

TEST_CASE(
    "a large message beside a bulk payload, both ways: written or pulled, from ordinary "
    "or registered memory") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  Served served(config, {&service});
  Large::Stub stub(served.channel.get());
  struct Case {
    size_t message;
    size_t bulk;
  };
  // Body and payload together within the arena (one staged WRITE), and past it (two ranges,
  // pulled into one buffer); a large body alone for a method that takes a payload.
  const Case cases[] = {
      {10 * 1024, 20 * 1024}, {300 * 1024, 64 * 1024}, {5000, 3 * kMiB}, {300 * 1024, 0}};
  std::vector<uint8_t> registered_bytes(4 * kMiB);
  absl::StatusOr<zrpc::RegisteredMemory> memory =
      served.channel->RegisterMemory(registered_bytes.data(), registered_bytes.size());
  REQUIRE(memory.ok());
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (bool registered : {false, true}) {
      INFO(c.message << "-byte message, " << c.bulk << "-byte payload"
                     << (registered ? " from registered memory" : ""));
      const Blob request = Data(c.message, ++seed);
      const std::string payload = Filled(c.bulk, ++seed);
      OutgoingBulk bulk;
      if (registered && c.bulk > 0) {
        std::copy(payload.begin(), payload.end(), registered_bytes.begin());
        absl::StatusOr<OutgoingBulk> from = memory->Bulk(0, c.bulk);
        REQUIRE(from.ok());
        bulk = *std::move(from);
      } else if (c.bulk > 0) {
        bulk = OutgoingBulk::Copy(payload);
      }
      Blob reply;
      IncomingBulk got;
      absl::Status s = stub.EchoBulk(request, std::move(bulk), &reply, &got, Within(kLong));
      INFO(s);
      REQUIRE(s.ok());
      CHECK(FirstDifference(reply.data(), request.data()) == "equal");
      CHECK(FirstDifference(got.view(), payload) == "equal");
      CHECK(got.empty() == (c.bulk == 0));
    }
  }
  CHECK(served.channel->stats().pulled_bytes_held == 0);
  CHECK(zrpc::testing::Eventually([&] { return served.server->stats().pulled_bytes_held == 0; }));
  CHECK(served.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "a large answer's payload lands in the caller's destination, its message in the "
    "runtime's memory") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  Served served(config, {&service});
  Large::Stub stub(served.channel.get());
  constexpr size_t kGuard = 4096;
  for (size_t bulk_size : {size_t{0}, size_t{100000}}) {
    INFO(bulk_size << "-byte payload");
    std::vector<uint8_t> bytes(bulk_size + 2 * kGuard, 0xA5);
    absl::StatusOr<zrpc::RegisteredMemory> memory =
        served.channel->RegisterMemory(bytes.data(), bytes.size());
    REQUIRE(memory.ok());
    zrpc::CallOptions options = Within(kLong);
    absl::StatusOr<zrpc::BulkDestination> destination =
        memory->Destination(kGuard, std::max<size_t>(bulk_size, 1));
    REQUIRE(destination.ok());
    options.response_destination = *destination;
    Blob request;
    request.set_reply_size(300 * 1024);
    request.set_reply_seed(77);
    const std::string payload = Filled(bulk_size, 78);
    Blob reply;
    IncomingBulk got;
    absl::Status s =
        stub.EchoBulk(request, bulk_size > 0 ? OutgoingBulk::Copy(payload) : OutgoingBulk(), &reply,
                      &got, options);
    INFO(s);
    REQUIRE(s.ok());
    CHECK(FirstDifference(reply.data(), Filled(300 * 1024, 77)) == "equal");
    CHECK(got.size() == bulk_size);
    if (bulk_size > 0) CHECK(got.data() == bytes.data() + kGuard);  // where the caller said
    CHECK(FirstDifference(got.view(), payload) == "equal");
    for (size_t i = 0; i < kGuard; ++i) {
      REQUIRE(bytes[i] == 0xA5);
      REQUIRE(bytes[bytes.size() - 1 - i] == 0xA5);
    }
    got.Reset();
    CHECK(served.channel->stats().pulled_bytes_held == 0);
  }
}

// Before: the call's end withdrew the body under the server's READ, which failed, and with it
// the connection and every other call on it.
TEST_CASE(
    "a call given up while the server pulls its large request fails, and its connection "
    "serves the next") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  zrpc::ServerOptions server_options;
  server_options.max_message_size = 64 * kMiB;
  zrpc::ChannelOptions channel_options;
  channel_options.max_message_size = 64 * kMiB;
  channel_options.keepalive_timeout = absl::Seconds(60);  // the grace: longer than the pull
  Served served(config, {&service}, server_options, channel_options);
  Large::Stub stub(served.channel.get());
  Blob request;
  request.set_data(std::string(64 * kMiB - 16, 'd'));
  request.set_reply_size(1);
  Blob reply;
  // Cancelled once the server is pulling (the pull takes seconds under emulation): the call
  // returns once the server has the body (it says so), its connection intact.
  zrpc::CallOptions options = Within(kLong);
  options.cancellation = std::make_shared<zrpc::Cancellation>();
  absl::Notification done;
  absl::Status s;
  stub.AsyncEcho(request, &reply, options, [&](absl::Status status) {
    s = std::move(status);
    done.Notify();
  });
  const std::map<std::string, uint64_t> counters = zrpc::testing::ReadDeviceCounters(config);
  REQUIRE(zrpc::testing::Eventually([&] { return served.server->stats().pulled_bytes_held > 0; }));
  const absl::Time cancelled = absl::Now();
  options.cancellation->Cancel();
  done.WaitForNotification();
  // The call returns once the server has the body: a return after the grace (60 s) means the
  // READ outlived it, and the device's counters say whether the device was retrying it.
  INFO("the cancelled call returned after "
       << absl::FormatDuration(absl::Now() - cancelled) << "; the server still held "
       << served.server->stats().pulled_bytes_held << " pulled bytes");
  INFO("device counters that moved by then: " << zrpc::testing::DeviceCounterChanges(
           counters, zrpc::testing::ReadDeviceCounters(config)));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kCancelled);
  request.set_data("small");
  s = stub.Echo(request, &reply, Within(kLong));
  INFO("device counters that moved by the next call's end: " << zrpc::testing::DeviceCounterChanges(
           counters, zrpc::testing::ReadDeviceCounters(config)));
  INFO(s);
  CHECK(s.ok());
  CHECK(reply.data().size() == 1);
  CHECK(served.channel->stats().connections_lost == 0);
  CHECK(zrpc::testing::Eventually([&] { return served.server->stats().pulled_bytes_held == 0; }));
}

// Before: a large answer's body past the channel's max_pulled_bytes, beside a destination,
// failed to start its READ and never released the destination's landing: the call hung.
TEST_CASE(
    "a large answer beside a destination that the channel has no memory for fails the "
    "call, and never hangs it") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  zrpc::ChannelOptions channel_options;
  channel_options.max_bulk_size = 64 * 1024;
  channel_options.max_pulled_bytes = 64 * 1024;
  Served served(config, {&service}, {}, channel_options);
  Large::Stub stub(served.channel.get());
  std::vector<uint8_t> bytes(8192);
  absl::StatusOr<zrpc::RegisteredMemory> memory =
      served.channel->RegisterMemory(bytes.data(), bytes.size());
  REQUIRE(memory.ok());
  zrpc::CallOptions options = Within(kLong);
  options.response_destination = *memory->Destination(0, bytes.size());
  Blob request;
  request.set_reply_size(300 * 1024);  // a body past the 64 KiB the channel may pull
  Blob reply;
  IncomingBulk got;
  absl::Notification done;
  absl::Status s;
  stub.AsyncEchoBulk(request, OutgoingBulk::Copy("payload"), &reply, &got, options,
                     [&](absl::Status status) {
                       s = std::move(status);
                       done.Notify();
                     });
  REQUIRE(done.WaitForNotificationWithTimeout(kLong));
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "ChannelOptions::max_pulled_bytes"));
  request.set_reply_size(10);
  REQUIRE(stub.EchoBulk(request, OutgoingBulk::Copy("x"), &reply, &got, options).ok());
  CHECK(got.view() == "x");
}

// Before: a body that filled its slot to the last 16 bytes stayed inline, and when its payload
// was pulled (always, beside a destination) it left no room for the descriptor: the answer
// failed INVALID_ARGUMENT.
TEST_CASE("an answer that fills its slot, beside a pulled payload, still goes") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  LargeService service;
  Served served(config, {&service});
  Large::Stub stub(served.channel.get());
  std::vector<uint8_t> bytes(4096);
  absl::StatusOr<zrpc::RegisteredMemory> memory =
      served.channel->RegisterMemory(bytes.data(), bytes.size());
  REQUIRE(memory.ok());
  zrpc::CallOptions options = Within(kLong);
  options.response_destination = *memory->Destination(0, bytes.size());
  // Serialized answers from 16 bytes under a slot's body (4056) to 8 past it.
  for (size_t serialized = 4056 - 24; serialized <= 4056 + 8; ++serialized) {
    INFO(serialized << "-byte answer");
    Blob request;
    request.set_reply_size(OfSerializedSize(serialized).data().size());
    request.set_reply_seed(serialized);
    Blob reply;
    IncomingBulk got;
    absl::Status s = stub.EchoBulk(request, OutgoingBulk::Copy("beside"), &reply, &got, options);
    INFO(s);
    REQUIRE(s.ok());
    CHECK(reply.ByteSizeLong() == serialized);
    CHECK(reply.data() == Filled(reply.data().size(), serialized));
    CHECK(got.view() == "beside");
  }
}

}  // namespace
