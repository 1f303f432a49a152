// Bulk payloads on stream messages (rpc/streaming.h, "Bulk payloads"), both ways, blocking and
// asynchronous: payloads of every size from none to 4 MiB beside small and pulled bodies, in
// every stream kind; a reader holding payloads holds its own memory, not the connection's; a
// Read without a place for the payload releases it; a payload on a method not marked for it is
// refused each way; the receiver's max_bulk_size at and one past; a stream given up on with
// payloads in flight lets them all go, and every sender's release runs.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/pattern.h"
#include "tests/rpc/numbers_fixture.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/stream_bulk.zrpc.h"
#include "tests/rpc/test_device.h"
#include "transport/options.h"

namespace {

using zrpc::CallOptions;
using zrpc::IncomingBulk;
using zrpc::OutgoingBulk;
using zrpc::testing::Chunk;
using zrpc::testing::Chunks;
using zrpc::testing::kLong;
using zrpc::testing::Summary;

const uint32_t kArena = zrpc::transport::ConnectionOptions().arena_size;

absl::string_view View(const IncomingBulk& bulk) {
  return {reinterpret_cast<const char*>(bulk.data()), bulk.size()};
}

// What a chunk's payload must be.
std::string Expected(const Chunk& chunk) {
  return zrpc::testing::Filled(chunk.size(), chunk.seq());
}

// A chunk numbered `seq` whose payload has `size` bytes, its message itself `pad` bytes larger.
Chunk Numbered(uint64_t seq, uint64_t size, size_t pad = 0) {
  Chunk chunk;
  chunk.set_seq(seq);
  chunk.set_size(size);
  chunk.set_pad(std::string(pad, 'p'));
  return chunk;
}

// Sends `bytes` (owned), counting its release in `*released`.
OutgoingBulk Counted(std::string bytes, std::atomic<uint64_t>* released) {
  auto* owned = new std::string(std::move(bytes));
  return OutgoingBulk(owned->data(), owned->size(), [owned, released] {
    delete owned;
    released->fetch_add(1);
  });
}

class BlockingChunks : public Chunks::Service {
 public:
  absl::Status Echo(zrpc::ServerContext&, zrpc::ServerReaderWriter<Chunk, Chunk>* stream) override {
    Chunk chunk;
    IncomingBulk bulk;
    while (stream->Read(&chunk, &bulk)) {
      if (View(bulk) != Expected(chunk)) mismatches.fetch_add(1);
      // The bytes received go back from where they landed: held until the client has them.
      auto held = std::make_shared<IncomingBulk>(std::move(bulk));
      OutgoingBulk back(held->data(), held->size(), [this, held] { released.fetch_add(1); });
      written.fetch_add(1);
      if (!stream->Write(chunk, std::move(back))) return absl::CancelledError("write failed");
    }
    return absl::OkStatus();
  }

  absl::Status Upload(zrpc::ServerContext&, zrpc::ServerReader<Chunk>* reader,
                      Summary* summary) override {
    Chunk chunk;
    IncomingBulk bulk;
    while (reader->Read(&chunk, &bulk)) {
      summary->set_chunks(summary->chunks() + 1);
      summary->set_bytes(summary->bytes() + bulk.size());
      if (View(bulk) != Expected(chunk)) summary->set_mismatches(summary->mismatches() + 1);
    }
    return absl::OkStatus();
  }

  absl::Status Download(zrpc::ServerContext&, const Chunk& request,
                        zrpc::ServerWriter<Chunk>* writer) override {
    for (uint64_t i = 0; i < request.count(); ++i) {
      const Chunk chunk = Numbered(request.seq() + i, request.size());
      written.fetch_add(1);
      if (!writer->Write(chunk, Counted(Expected(chunk), &released))) {
        return absl::CancelledError("write failed");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Plain(zrpc::ServerContext&,
                     zrpc::ServerReaderWriter<Chunk, Chunk>* stream) override {
    Chunk chunk;
    while (stream->Read(&chunk)) {
      // Refused: Plain's responses carry no payload, so this write fails the stream.
      OutgoingBulk payload =
          chunk.size() > 0 ? OutgoingBulk::Copy(Expected(chunk)) : OutgoingBulk();
      if (!stream->Write(chunk, std::move(payload))) return absl::CancelledError("write failed");
    }
    return absl::OkStatus();
  }

  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> written{0};   // payloads handed to Write (Echo, Download)
  std::atomic<uint64_t> released{0};  // their releases run
};

// Echo, asynchronously: each chunk read with its payload, written back with it.
class AsyncChunks : public Chunks::AsyncService {
 public:
  void Echo(std::unique_ptr<zrpc::ServerAsyncReaderWriter<Chunk, Chunk>> call) override {
    (new Echoer(this, std::move(call)))->Next();
  }

  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> released{0};

 private:
  struct Echoer {
    Echoer(AsyncChunks* s, std::unique_ptr<zrpc::ServerAsyncReaderWriter<Chunk, Chunk>> c)
        : service(s), call(std::move(c)) {}
    void Next() {
      call->Read(&chunk, &bulk, [this](bool ok) {
        if (!ok) {
          call->Finish(absl::OkStatus());
          delete this;
          return;
        }
        if (View(bulk) != Expected(chunk)) service->mismatches.fetch_add(1);
        auto held = std::make_shared<IncomingBulk>(std::move(bulk));
        AsyncChunks* counts = service;
        OutgoingBulk back(held->data(), held->size(),
                          [counts, held] { counts->released.fetch_add(1); });
        call->Write(chunk, std::move(back), [this](bool sent) {
          if (!sent) {
            call->Finish(absl::CancelledError("write failed"));
            delete this;
            return;
          }
          Next();
        });
      });
    }
    AsyncChunks* service;
    std::unique_ptr<zrpc::ServerAsyncReaderWriter<Chunk, Chunk>> call;
    Chunk chunk;
    IncomingBulk bulk;
  };
};

template <typename Service>
struct ChunksFixture {
  Service service;
  std::unique_ptr<zrpc::Server> server;
  std::unique_ptr<zrpc::ClientChannel> channel;

  explicit ChunksFixture(const zrpc::transport::DeviceConfig& config,
                         zrpc::ChannelOptions channel_options = {}) {
    zrpc_test::ServeAndConnect(&service, config, {}, std::move(channel_options), &server, &channel);
  }

  // Both sides' pulled memory back to nothing, no stream open, nobody broke the protocol, and
  // nothing staged but `staged` bytes of messages without a payload: a stream's payloads are
  // always pulled.
  void CheckSettled(uint64_t staged = 0) {
    CHECK(zrpc::testing::Eventually([&] {
      return server->stats().pulled_bytes_held == 0 && channel->stats().pulled_bytes_held == 0 &&
             server->stats().streams_open == 0;
    }));
    CHECK(server->stats().protocol_violations == 0);
    CHECK(channel->stats().protocol_violations == 0);
    CHECK(server->stats().bulk_bytes_staged == staged);
    CHECK(channel->stats().bulk_bytes_staged == staged);
  }
};
using Fixture = ChunksFixture<BlockingChunks>;

// One chunk with a payload goes over Echo and comes back whole: the connection serves on.
void EchoesOne(Chunks::Stub& stub, uint64_t seq, uint64_t size) {
  zrpc::ClientReaderWriter<Chunk, Chunk> echo = stub.Echo(CallOptions::Timeout(kLong));
  const Chunk sent = Numbered(seq, size);
  REQUIRE(echo.Write(sent, OutgoingBulk::Copy(Expected(sent))));
  Chunk back;
  IncomingBulk bulk;
  REQUIRE(echo.Read(&back, &bulk));
  CHECK(back.seq() == seq);
  CHECK(zrpc::testing::FirstDifference(View(bulk), Expected(sent)) == "equal");
  REQUIRE(echo.WritesDone());
  CHECK(echo.Finish().ok());
}

TEST_CASE("bidirectional: payloads from none to 4 MiB beside small and pulled bodies, both ways",
          "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  std::atomic<uint64_t> released{0};  // before the fixture: releases may run until it goes
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  zrpc::ClientReaderWriter<Chunk, Chunk> echo = stub.Echo(CallOptions::Timeout(kLong));
  const std::vector<uint64_t> sizes = {
      0, 1, 4040, kArena - 1, kArena + 1, size_t{1} << 20, size_t{4} << 20};
  const std::vector<size_t> pads = {0, 10'000, size_t{kArena} + 1};
  uint64_t seq = 1;
  uint64_t staged = 0;  // messages past a slot with no payload beside them are staged, as ever
  for (uint64_t size : sizes) {
    // The message in its slot, past a slot (pulled beside its payload), and past the arena.
    for (size_t pad : pads) {
      INFO("payload " << size << ", pad " << pad);
      const Chunk sent = Numbered(seq++, size, pad);
      if (size == 0 && pad == 10'000) staged += sent.ByteSizeLong();
      REQUIRE(echo.Write(sent, Counted(Expected(sent), &released)));
      Chunk back;
      IncomingBulk bulk;
      REQUIRE(echo.Read(&back, &bulk));
      CHECK(back.seq() == sent.seq());
      CHECK(back.pad().size() == pad);
      CHECK(bulk.size() == size);
      CHECK(zrpc::testing::FirstDifference(View(bulk), Expected(sent)) == "equal");
    }
  }
  REQUIRE(echo.WritesDone());
  Chunk extra;
  CHECK_FALSE(echo.Read(&extra));
  const absl::Status status = echo.Finish();
  INFO(status);
  CHECK(status.ok());
  CHECK(f.service.mismatches == 0);
  // Every payload's release ran on each side, once its reader had it.
  const uint64_t count = pads.size() * sizes.size();
  CHECK(zrpc::testing::Eventually(
      [&] { return released.load() == count && f.service.released.load() == count; }));
  f.CheckSettled(staged);
}

TEST_CASE("client streaming: each payload checked by the server, then the one response",
          "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  Summary summary;
  zrpc::ClientWriter<Chunk> writer = stub.Upload(&summary, CallOptions::Timeout(kLong));
  uint64_t bytes = 0;
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    const Chunk chunk = Numbered(seq, seq == 5 ? 0 : seq * 100'000);
    bytes += chunk.size();
    // Some without their payload's OutgoingBulk: the plain Write carries none.
    if (chunk.size() == 0) {
      REQUIRE(writer.Write(chunk));
    } else {
      REQUIRE(writer.Write(chunk, OutgoingBulk::Copy(Expected(chunk))));
    }
  }
  REQUIRE(writer.WritesDone());
  const absl::Status status = writer.Finish();
  INFO(status);
  CHECK(status.ok());
  CHECK(summary.chunks() == 10);
  CHECK(summary.bytes() == bytes);
  CHECK(summary.mismatches() == 0);
  f.CheckSettled();
}

TEST_CASE("server streaming: payloads read, and released unread by a Read without a place",
          "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  Chunk request = Numbered(100, kArena + 7);
  request.set_count(8);
  zrpc::ClientReader<Chunk> reader = stub.Download(request, CallOptions::Timeout(kLong));
  Chunk chunk;
  IncomingBulk bulk;
  uint64_t next = 100;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(reader.Read(&chunk, &bulk));
    CHECK(chunk.seq() == next++);
    CHECK(zrpc::testing::FirstDifference(View(bulk), Expected(chunk)) == "equal");
  }
  bulk.Reset();
  while (reader.Read(&chunk)) CHECK(chunk.seq() == next++);  // their payloads released here
  CHECK(next == 108);
  const absl::Status status = reader.Finish();
  INFO(status);
  CHECK(status.ok());
  CHECK(zrpc::testing::Eventually([&] { return f.service.released.load() == 8; }));
  f.CheckSettled();
}

TEST_CASE("payloads a reader holds are its own memory: the connection serves on meanwhile",
          "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  // Eight payloads of a whole arena each: written into the arena, the second would wait for the
  // first's release.
  Chunk request = Numbered(1, kArena);
  request.set_count(8);
  zrpc::ClientReader<Chunk> reader = stub.Download(request, CallOptions::Timeout(kLong));
  std::vector<IncomingBulk> held;
  Chunk chunk;
  for (int i = 0; i < 8; ++i) {
    IncomingBulk bulk;
    REQUIRE(reader.Read(&chunk, &bulk));
    CHECK(zrpc::testing::FirstDifference(View(bulk), Expected(chunk)) == "equal");
    held.push_back(std::move(bulk));
  }
  CHECK(f.channel->stats().pulled_bytes_held >= uint64_t{8} * kArena);
  // Another stream on the same connection moves payloads both ways while those are held.
  EchoesOne(stub, 50, kArena + 1);
  CHECK_FALSE(reader.Read(&chunk));
  CHECK(reader.Finish().ok());
  CHECK(f.channel->stats().pulled_bytes_held >= uint64_t{8} * kArena);
  held.clear();
  f.CheckSettled();
}

TEST_CASE("asynchronous ends, client and server, carry payloads both ways", "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  // Before the stream: a callback or a release may run until it (and the fixture) are gone.
  const std::vector<uint64_t> sizes = {3, 0, kArena + 1, 70'000, size_t{2} << 20};
  std::atomic<uint64_t> released{0};
  Chunk sent;
  Chunk back;
  IncomingBulk bulk;
  size_t at = 0;
  int wrong = 0;
  absl::Notification done;
  ChunksFixture<AsyncChunks> f(config);
  Chunks::Stub stub(f.channel.get());
  zrpc::AsyncClientReaderWriter<Chunk, Chunk> echo = stub.AsyncEcho(CallOptions::Timeout(kLong));
  std::function<void()> next = [&] {
    if (at == sizes.size()) {
      echo.WritesDone();
      return done.Notify();
    }
    sent = Numbered(at + 1, sizes[at]);
    echo.Write(sent, Counted(Expected(sent), &released), [&](bool ok) {
      if (!ok) return done.Notify();
      echo.Read(&back, &bulk, [&](bool read) {
        if (!read) return done.Notify();
        if (back.seq() != sent.seq() || View(bulk) != Expected(sent)) ++wrong;
        bulk.Reset();
        ++at;
        next();
      });
    });
  };
  next();
  REQUIRE(done.WaitForNotificationWithTimeout(kLong));
  CHECK(at == sizes.size());
  CHECK(wrong == 0);
  absl::Notification finished;
  absl::Status status;
  echo.Finish([&](absl::Status s) {
    status = s;
    finished.Notify();
  });
  REQUIRE(finished.WaitForNotificationWithTimeout(kLong));
  INFO(status);
  CHECK(status.ok());
  CHECK(f.service.mismatches == 0);
  CHECK(zrpc::testing::Eventually([&] {
    return released.load() == sizes.size() && f.service.released.load() == sizes.size();
  }));
  f.CheckSettled();
}

TEST_CASE("one buffer written many times in a row, before the reader has it, arrives each time",
          "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  // Alive until the channel is gone: a payload without a release callback (rpc/bulk.h).
  const std::string bytes = zrpc::testing::Filled(kArena + 3, 77);
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  Summary summary;
  zrpc::ClientWriter<Chunk> writer = stub.Upload(&summary, CallOptions::Timeout(kLong));
  for (int i = 0; i < 10; ++i) {
    REQUIRE(writer.Write(Numbered(77, bytes.size()), OutgoingBulk(bytes.data(), bytes.size())));
  }
  REQUIRE(writer.WritesDone());
  const absl::Status status = writer.Finish();
  INFO(status);
  CHECK(status.ok());
  CHECK(summary.chunks() == 10);
  CHECK(summary.mismatches() == 0);
  f.CheckSettled();
}

TEST_CASE("a payload on a method not marked for it is refused, each way", "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  std::atomic<uint64_t> released{0};
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  SECTION("written by the client: the Write fails, and the call, naming request_bulk") {
    zrpc::ClientReaderWriter<Chunk, Chunk> plain = stub.Plain(CallOptions::Timeout(kLong));
    const Chunk chunk = Numbered(1, 10);
    CHECK_FALSE(plain.Write(chunk, Counted(Expected(chunk), &released)));
    CHECK(released == 1);  // released at once, never exposed
    const absl::Status status = plain.Finish();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(status.message(), "request_bulk"));
  }
  SECTION("written asynchronously by the client: the callback says false, the call fails") {
    absl::Notification written;
    bool sent = true;
    absl::Notification finished;
    absl::Status status;
    zrpc::AsyncClientReaderWriter<Chunk, Chunk> plain =
        stub.AsyncPlain(CallOptions::Timeout(kLong));
    const Chunk chunk = Numbered(1, 10);
    plain.Write(chunk, Counted(Expected(chunk), &released), [&](bool ok) {
      sent = ok;
      written.Notify();
    });
    REQUIRE(written.WaitForNotificationWithTimeout(kLong));
    CHECK_FALSE(sent);
    CHECK(released == 1);
    plain.Finish([&](absl::Status s) {
      status = s;
      finished.Notify();
    });
    REQUIRE(finished.WaitForNotificationWithTimeout(kLong));
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(status.message(), "request_bulk"));
  }
  SECTION("written by the server: its Write fails, and the call, naming response_bulk") {
    zrpc::ClientReaderWriter<Chunk, Chunk> plain = stub.Plain(CallOptions::Timeout(kLong));
    REQUIRE(plain.Write(Numbered(1, 10)));
    Chunk back;
    CHECK_FALSE(plain.Read(&back));
    const absl::Status status = plain.Finish();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(status.message(), "response_bulk"));
  }
  // The connection serves on.
  EchoesOne(stub, 9, kArena + 1);
  f.CheckSettled();
}

TEST_CASE("the receiver's max_bulk_size: at the limit read, one past refused before reading",
          "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  constexpr uint64_t kLimit = 64 << 10;
  zrpc::ChannelOptions channel_options;
  channel_options.max_bulk_size = kLimit;
  Fixture f(config, channel_options);
  Chunks::Stub stub(f.channel.get());
  for (uint64_t size : {kLimit, kLimit + 1}) {
    INFO(size);
    Chunk request = Numbered(1, size);
    request.set_count(1);
    zrpc::ClientReader<Chunk> reader = stub.Download(request, CallOptions::Timeout(kLong));
    Chunk chunk;
    IncomingBulk bulk;
    const bool read = reader.Read(&chunk, &bulk);
    const absl::Status status = reader.Finish();
    INFO(status);
    if (size == kLimit) {
      CHECK(read);
      CHECK(bulk.size() == kLimit);
      CHECK(status.ok());
    } else {
      CHECK_FALSE(read);
      CHECK(status.code() == absl::StatusCode::kResourceExhausted);
      CHECK(absl::StrContains(status.message(), "max_bulk_size"));
    }
  }
  // The connection serves on, and the refused payload was let go by its sender.
  EchoesOne(stub, 3, 1000);
  CHECK(f.service.written == 3);
  CHECK(zrpc::testing::Eventually([&] { return f.service.released.load() == 3; }));
  f.CheckSettled();
}

TEST_CASE("a stream given up on with payloads in flight lets them all go", "[stream_bulk]") {
  ZRPC_TEST_DEVICE(config);
  Fixture f(config);
  Chunks::Stub stub(f.channel.get());
  for (int round = 0; round < 3; ++round) {
    Chunk request = Numbered(1, kArena + 1);
    request.set_count(1000);
    zrpc::ClientReader<Chunk> reader = stub.Download(request, CallOptions::Timeout(kLong));
    Chunk chunk;
    IncomingBulk bulk;
    for (int i = 0; i < round; ++i) REQUIRE(reader.Read(&chunk, &bulk));
    reader.Cancel();
    const absl::Status status = reader.Finish();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kCancelled);
  }
  // Every payload the server handed over was released: pulled, or let go unread.
  CHECK(zrpc::testing::Eventually(
      [&] { return f.service.released.load() == f.service.written.load(); }));
  f.CheckSettled();
  EchoesOne(stub, 5, kArena + 1);
}

}  // namespace
