// Stream messages larger than the receiver's arena travel pulled (rpc/WIRE.md, "Streams"), up to
// max_message_size (4 MiB by default), with nothing set, in every stream kind and both ways:
// gRPC's full-duplex interoperability case (271,828- and 314,159-byte messages), 4 MiB messages
// at and one past the limit, order kept between pulled and small messages, a half-close and a
// call's end that never overtake a message still being pulled, a receiver's own limit, an
// asynchronous reader, and a stream given up on while its messages are pulled.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "proto/examples/numbers.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/rpc/numbers_fixture.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/test_device.h"
#include "transport/options.h"

namespace {

using zrpc::CallOptions;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;
using zrpc::testing::kLong;
using zrpc_test::Counting;
using Fixture = zrpc_test::NumbersFixture;

const uint32_t kArena = zrpc::transport::ConnectionOptions().arena_size;
constexpr size_t kMaxMessage = size_t{4} << 20;  // max_message_size's default

// A Number of `bytes` serialized bytes exactly (value `value`, 1 to 127: one varint byte, and
// doubled still one), its pad a pattern that tells messages apart.
Number Sized(size_t bytes, uint64_t value) {
  Number number;
  number.set_value(value);
  size_t pad = bytes - 4;  // tags, the value's byte, a 1-byte length
  while (true) {
    number.set_pad(std::string(pad, static_cast<char>('a' + value % 26)));
    const size_t size = number.ByteSizeLong();
    if (size == bytes) return number;
    REQUIRE(size > bytes);
    pad -= size - bytes;
  }
}

// A message just past the arena, `value` in it, goes over a stream and comes back whole: the
// connection still carries pulled messages.
void EchoesPulled(Numbers::Stub& stub, uint64_t value) {
  zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
  const Number sent = Sized(kArena + 1, value);
  REQUIRE(chat.Write(sent));
  Number back;
  REQUIRE(chat.Read(&back));
  CHECK(back.pad() == sent.pad());
  REQUIRE(chat.WritesDone());
  CHECK(chat.Finish().ok());
}

// Both sides' memory held by pulled payloads goes back to nothing, and nobody broke the
// protocol.
void CheckSettled(Fixture& f) {
  CHECK(zrpc::testing::Eventually([&] {
    return f.server->stats().pulled_bytes_held == 0 && f.channel->stats().pulled_bytes_held == 0 &&
           f.server->stats().streams_open == 0;
  }));
  CHECK(f.server->stats().protocol_violations == 0);
  CHECK(f.channel->stats().protocol_violations == 0);
}

TEST_CASE("gRPC's full-duplex case: 271,828- and 314,159-byte messages each way, pulled",
          "[stream_pull]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  REQUIRE(271'828 > kArena);
  const uint64_t server_registrations = f.server->stats().memory_registrations;
  zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
  // gRPC's sizes, with small ones between: each echoed whole and in order.
  const std::vector<size_t> sizes = {271'828, 8, 314'159, 1'828, 271'828, 314'159};
  uint64_t value = 1;
  for (size_t size : sizes) {
    INFO(size);
    const Number sent = Sized(size, value);
    REQUIRE(chat.Write(sent));
    Number back;
    REQUIRE(chat.Read(&back));
    CHECK(back.value() == 2 * value);
    CHECK(back.pad() == sent.pad());
    ++value;
  }
  REQUIRE(chat.WritesDone());
  const absl::Status status = chat.Finish();
  INFO(status);
  CHECK(status.ok());
  // Pulled, not written: memory registered to expose each message and to pull it into (the
  // server and the channel share the process's device, whose count this is).
  CHECK(f.server->stats().memory_registrations >= server_registrations + 4);
  CHECK(f.server->stats().bulk_bytes_staged == 0);
  CheckSettled(f);
}

TEST_CASE("4 MiB stream messages both ways; one byte past max_message_size is refused",
          "[stream_pull]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  SECTION("bidirectional: at the limit, echoed; one past, refused by the writer") {
    zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
    for (uint64_t value = 1; value <= 3; ++value) {
      const Number sent = Sized(kMaxMessage, value);
      REQUIRE(chat.Write(sent));
      Number back;
      REQUIRE(chat.Read(&back));
      CHECK(back.value() == 2 * value);
      CHECK(back.pad() == sent.pad());
    }
    CHECK_FALSE(chat.Write(Sized(kMaxMessage + 1, 4)));
    const absl::Status status = chat.Finish();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(status.message(), "max_message_size"));
  }
  SECTION("server streaming: 4 MiB messages, then the end, which does not overtake them") {
    zrpc::examples::CountRequest request = Counting(3);
    request.set_pad_bytes(kMaxMessage - 8);  // with its tags and lengths, 4 MiB - 1 in all
    zrpc::ClientReader<Number> reader = stub.Count(request, CallOptions::Timeout(kLong));
    Number number;
    uint64_t next = 1;
    while (reader.Read(&number)) {
      CHECK(number.value() == next++);
      CHECK(number.pad().size() == kMaxMessage - 8);
    }
    CHECK(next == 4);
    const absl::Status status = reader.Finish();
    INFO(status);
    CHECK(status.ok());
  }
  SECTION("client streaming: 4 MiB messages, then the half-close, which does not overtake them") {
    Total total;
    zrpc::ClientWriter<Number> writer = stub.Sum(&total, CallOptions::Timeout(kLong));
    for (uint64_t value = 1; value <= 3; ++value) REQUIRE(writer.Write(Sized(kMaxMessage, value)));
    REQUIRE(writer.WritesDone());
    const absl::Status status = writer.Finish();
    INFO(status);
    CHECK(status.ok());
    CHECK(total.count() == 3);
    CHECK(total.sum() == 6);
  }
  CheckSettled(f);
}

TEST_CASE("pulled and small stream messages keep their order, many at once in flight",
          "[stream_pull]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  // The client writes them all before reading any: a window's worth pulled and small messages in
  // flight together, each way.
  zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
  constexpr uint64_t kCount = 12;
  std::vector<size_t> sizes;
  for (uint64_t value = 1; value <= kCount; ++value) {
    sizes.push_back(value % 3 == 0 ? 16 : kArena + 1000 * value);
  }
  std::thread writer([&] {
    for (uint64_t value = 1; value <= kCount; ++value) {
      if (!chat.Write(Sized(sizes[value - 1], value))) return;
    }
    chat.WritesDone();
  });
  Number back;
  uint64_t value = 1;
  while (chat.Read(&back)) {
    CHECK(back.value() == 2 * value);
    CHECK(back.ByteSizeLong() == sizes[value - 1]);
    ++value;
  }
  writer.join();
  CHECK(value == kCount + 1);
  CHECK(chat.Finish().ok());
  CheckSettled(f);
}

TEST_CASE("a receiver's max_message_size refuses a pulled stream message before reading it",
          "[stream_pull]") {
  ZRPC_TEST_DEVICE(config);
  zrpc::ChannelOptions channel_options;
  channel_options.max_message_size = 1 << 20;
  Fixture f(config, {}, channel_options);
  Numbers::Stub stub(f.channel.get());
  zrpc::examples::CountRequest request = Counting(2);
  request.set_pad_bytes((1 << 20) + 1);
  zrpc::ClientReader<Number> reader = stub.Count(request, CallOptions::Timeout(kLong));
  Number number;
  CHECK_FALSE(reader.Read(&number));
  const absl::Status status = reader.Finish();
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  // The client's own limit refused it (the server's writer had no reason to).
  CHECK(absl::StrContains(status.message(), "ChannelOptions::max_message_size"));
  CHECK(f.channel->stats().pulled_bytes_held == 0);
  // The connection serves on.
  EchoesPulled(stub, 7);
  CheckSettled(f);
}

TEST_CASE("an asynchronous reader gets pulled messages in order, then the end", "[stream_pull]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::examples::CountRequest request = Counting(6);
  request.set_pad_bytes(kArena + 1);
  zrpc::AsyncClientReader<Number> reader = stub.AsyncCount(request, CallOptions::Timeout(kLong));
  Number number;
  uint64_t next = 1;
  bool in_order = true;
  absl::Notification read_all;
  std::function<void(bool)> on_read = [&](bool ok) {
    if (!ok) return read_all.Notify();
    in_order = in_order && number.value() == next && number.pad().size() == kArena + 1;
    ++next;
    reader.Read(&number, on_read);
  };
  reader.Read(&number, on_read);
  REQUIRE(read_all.WaitForNotificationWithTimeout(kLong));
  absl::Notification finished;
  absl::Status status;
  reader.Finish([&](absl::Status s) {
    status = s;
    finished.Notify();
  });
  REQUIRE(finished.WaitForNotificationWithTimeout(kLong));
  CHECK(status.ok());
  CHECK(in_order);
  CHECK(next == 7);
  CheckSettled(f);
}

TEST_CASE("a stream given up on while its messages are pulled lets them all go", "[stream_pull]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  for (int round = 0; round < 3; ++round) {
    zrpc::examples::CountRequest request = Counting(1000);
    request.set_pad_bytes(kArena + 1);
    zrpc::ClientReader<Number> reader = stub.Count(request, CallOptions::Timeout(kLong));
    Number number;
    for (int i = 0; i < round; ++i) REQUIRE(reader.Read(&number));
    reader.Cancel();
    const absl::Status status = reader.Finish();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kCancelled);
  }
  // The server's exposed messages were all let go (pulled or refused), its handlers ended.
  CheckSettled(f);
  // And the connection still carries pulled messages.
  EchoesPulled(stub, 9);
}

}  // namespace
