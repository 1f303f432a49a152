// The asynchronous form of server streams (an AsyncService's streaming handlers: rpc/streaming.h,
// "Asynchronous server streams") on a device (tag "rdma"): each kind served from callbacks only,
// with no thread per stream (more streams open at once than ServerOptions::max_streams allows
// threads), order, callbacks that never nest or overlap, large messages written from the
// poller (the staging quota waited for without blocking it), a handler that drops its stream
// unfinished, a client that cancels, a Finish with a Read outstanding, and Shutdown during a
// stream. Handlers record what they saw; the test thread checks it.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/examples/numbers.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/rdma_device.h"
#include "tests/rpc/numbers_fixture.h"
#include "tests/rpc/raw_client.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::CallOptions;
using zrpc::examples::CountRequest;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;
using zrpc_test::Counting;

constexpr absl::Duration kLong = absl::Seconds(120);

// Catches callbacks of one stream that nest or overlap.
struct Serial {
  std::atomic<int> inside{0};
  std::atomic<int>* overlaps = nullptr;
  void Enter() {
    if (inside.fetch_add(1) != 0) overlaps->fetch_add(1);
  }
  void Leave() { inside.fetch_sub(1); }
};

class AsyncNumbers;

// Count: each Write's callback writes the next. fail_after > 0 finishes ABORTED after that many;
// fail_after < 0 drops the stream unfinished after -fail_after.
struct Counter {
  Counter(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> c);
  AsyncNumbers* service;
  std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> call;
  Serial serial;
  Number number;
  uint64_t sent = 0;
  void Next();
  void OnWritten(bool ok);
};

// Sum: each Read's callback reads the next, until the client half-closes.
struct Summer {
  Summer(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> c);
  AsyncNumbers* service;
  std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call;
  Serial serial;
  Number number;
  uint64_t expected = 1;
  void Next() {
    call->Read(&number, [this](bool ok) { OnRead(ok); });
  }
  void OnRead(bool ok);
};

// Double: read one, write it doubled, read the next. A zero: a Read is started and then the call
// finishes ABORTED at once, with that Read outstanding.
struct Doubler {
  Doubler(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> c);
  AsyncNumbers* service;
  std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call;
  Serial serial;
  Number in;
  Number out;
  void Next() {
    call->Read(&in, [this](bool ok) { OnRead(ok); });
  }
  void OnRead(bool ok);
};

class AsyncNumbers : public Numbers::AsyncService {
 public:
  void Count(std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> call) override {
    if (take_count) return take_count(std::move(call));
    (new Counter(this, std::move(call)))->Next();
  }
  void Sum(std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call) override {
    (new Summer(this, std::move(call)))->Next();
  }
  void Double(std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call) override {
    if (take_double) return take_double(std::move(call));
    (new Doubler(this, std::move(call)))->Next();
  }

  // Set: Count hands its call here instead of serving it (before the server starts).
  std::function<void(std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>>)> take_count;
  std::function<void(std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>>)> take_double;
  std::atomic<uint64_t> written{0};
  std::atomic<int> stopped{0};     // a Write that failed: the client went or gave up
  std::atomic<int> ended{0};       // handlers done with their stream (finished or dropped)
  std::atomic<int> overlaps{0};    // callbacks of one stream that nested or overlapped
  std::atomic<int> late_reads{0};  // Reads outstanding at Finish that completed with false
};

Counter::Counter(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> c)
    : service(s), call(std::move(c)) {
  serial.overlaps = &s->overlaps;
  number.set_pad(std::string(call->request().pad_bytes(), 'p'));
}

Summer::Summer(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> c)
    : service(s), call(std::move(c)) {
  serial.overlaps = &s->overlaps;
}

Doubler::Doubler(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> c)
    : service(s), call(std::move(c)) {
  serial.overlaps = &s->overlaps;
}

void Counter::Next() {
  const CountRequest& request = call->request();
  if (request.fail_after() < 0 && sent == static_cast<uint64_t>(-request.fail_after())) {
    service->ended.fetch_add(1);
    delete this;  // unfinished: the runtime answers INTERNAL
    return;
  }
  if (request.fail_after() > 0 && sent == static_cast<uint64_t>(request.fail_after())) {
    call->Finish(absl::AbortedError(absl::StrCat("failed after ", sent, " numbers")));
  } else if (sent == request.count()) {
    call->Finish(absl::OkStatus());
  } else {
    number.set_value(request.start() + sent);
    call->Write(number, [this](bool ok) { OnWritten(ok); });
    return;
  }
  service->ended.fetch_add(1);
  delete this;
}

void Counter::OnWritten(bool ok) {
  serial.Enter();
  if (!ok) {
    service->stopped.fetch_add(1);
    call->Finish(absl::CancelledError("write failed"));
    service->ended.fetch_add(1);
    serial.Leave();
    delete this;
    return;
  }
  ++sent;
  service->written.fetch_add(1);
  serial.Leave();
  Next();
}

void Summer::OnRead(bool ok) {
  serial.Enter();
  absl::Status status = absl::OkStatus();
  if (ok && number.value() != expected++) status = absl::DataLossError("out of order");
  if (ok && status.ok()) {
    call->response()->set_sum(call->response()->sum() + number.value());
    call->response()->set_count(call->response()->count() + 1);
    serial.Leave();
    Next();
    return;
  }
  call->Finish(status);
  service->ended.fetch_add(1);
  serial.Leave();
  delete this;
}

void Doubler::OnRead(bool ok) {
  serial.Enter();
  if (!ok) {
    call->Finish(absl::OkStatus());
    service->ended.fetch_add(1);
    serial.Leave();
    delete this;
    return;
  }
  if (in.value() == 0) {
    AsyncNumbers* numbers = service;
    // Destroyed by the outstanding Read's callback, which Finish completes with false.
    call->Read(&in, [this, numbers](bool more) {
      if (!more) numbers->late_reads.fetch_add(1);
      numbers->ended.fetch_add(1);
      delete this;
    });
    call->Finish(absl::AbortedError("a zero"));
    serial.Leave();
    return;
  }
  out.set_value(in.value() * 2);
  call->Write(out, [this](bool sent) {
    serial.Enter();
    if (!sent) {
      call->Finish(absl::CancelledError("write failed"));
      service->ended.fetch_add(1);
      serial.Leave();
      delete this;
      return;
    }
    serial.Leave();
    Next();
  });
  serial.Leave();
}

struct AsyncFixture {
  AsyncNumbers service;
  std::unique_ptr<zrpc::Server> server;
  std::unique_ptr<zrpc::ClientChannel> channel;

  explicit AsyncFixture(const zrpc::transport::DeviceConfig& config,
                        zrpc::ServerOptions options = {}) {
    zrpc_test::ServeAndConnect(&service, config, std::move(options), {}, &server, &channel);
  }
  // Every stream's handler is done and its call retired.
  void RequireAllEnded(int streams) {
    CHECK(zrpc::testing::Eventually(
        [&] { return service.ended.load() == streams && server->stats().calls_in_flight == 0; }));
    CHECK(service.overlaps.load() == 0);
    CHECK(server->stats().streams_started == 0);  // no stream had a thread
  }
};

TEST_CASE("async server streaming: 20,000 numbers written from callbacks, in order",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReader<Number> reader = stub.Count(Counting(20'000), CallOptions::Timeout(kLong));
  Number number;
  uint64_t count = 0;
  uint64_t out_of_order = 0;
  while (reader.Read(&number)) {
    if (number.value() != count + 1) ++out_of_order;
    ++count;
  }
  CHECK(reader.Finish().ok());
  CHECK(count == 20'000);
  CHECK(out_of_order == 0);
  CHECK(f.server->stats().async_streams_started == 1);
  f.RequireAllEnded(1);
}

TEST_CASE("async client streaming: 5,000 numbers read from callbacks, then the sum",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  Total total;
  zrpc::ClientWriter<Number> writer = stub.Sum(&total, CallOptions::Timeout(kLong));
  Number number;
  uint64_t bytes = 0;
  for (uint64_t i = 1; i <= 5'000; ++i) {
    number.set_value(i);
    bytes += number.ByteSizeLong();
    REQUIRE(writer.Write(number));
  }
  CHECK(writer.WritesDone());
  REQUIRE(writer.Finish().ok());
  CHECK(total.count() == 5'000);
  CHECK(total.sum() == 5'000ull * 5'001 / 2);
  f.RequireAllEnded(1);
  // The server counts what the stream brought (on arrival: its handler has no Read of its own
  // that could count them).
  uint64_t received = 0;
  for (const zrpc::MethodMetricsSnapshot& m : f.server->metrics().Snapshot()) {
    if (m.method == "zrpc.examples.Numbers/Sum") received = m.message_bytes_received;
  }
  CHECK(received == bytes);
}

TEST_CASE("async bidirectional: 3,000 numbers doubled while the client writes and reads",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
  constexpr uint64_t kCount = 3'000;
  std::thread writer([&] {
    Number number;
    for (uint64_t i = 1; i <= kCount; ++i) {
      number.set_value(i);
      if (!chat.Write(number)) break;
    }
    chat.WritesDone();
  });
  Number number;
  uint64_t count = 0;
  uint64_t wrong = 0;
  while (chat.Read(&number)) {
    ++count;
    if (number.value() != 2 * count) ++wrong;
  }
  writer.join();
  CHECK(chat.Finish().ok());
  CHECK(count == kCount);
  CHECK(wrong == 0);
  f.RequireAllEnded(1);
}

TEST_CASE("async streams take no thread: 12 open at once on a server allowing 2 stream threads",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions options;
  options.max_streams = 2;
  AsyncFixture f(config, options);
  Numbers::Stub stub(f.channel.get());
  constexpr int kStreams = 12;
  constexpr uint64_t kEach = 300;  // past the window: every stream waits for its reader
  std::vector<zrpc::ClientReader<Number>> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.push_back(stub.Count(Counting(kEach), CallOptions::Timeout(kLong)));
  }
  // Read round-robin, one message at a time: every stream stays open until the last round.
  std::vector<uint64_t> counts(kStreams, 0);
  Number number;
  for (uint64_t round = 0; round < kEach; ++round) {
    for (int i = 0; i < kStreams; ++i) {
      if (readers[i].Read(&number) && number.value() == round + 1) ++counts[i];
    }
  }
  for (int i = 0; i < kStreams; ++i) {
    CHECK(!readers[i].Read(&number));
    CHECK(readers[i].Finish().ok());
    CHECK(counts[i] == kEach);
  }
  CHECK(f.server->stats().streams_refused == 0);
  CHECK(f.server->stats().async_streams_started == kStreams);
  // And in what /metrics serves.
  const std::string text = f.server->PrometheusText();
  CHECK(text.find(absl::StrCat("\nzrpc_server_async_streams_started_total ", kStreams, "\n")) !=
        std::string::npos);
  CHECK(text.find("\nzrpc_server_stream_threads_started_total 0\n") != std::string::npos);
  f.RequireAllEnded(kStreams);
}

TEST_CASE("async server streaming: 200 messages of 64 KiB written from the poller's callbacks",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  CountRequest request = Counting(200);
  request.set_pad_bytes(64 * 1024);
  zrpc::ClientReader<Number> reader = stub.Count(request, CallOptions::Timeout(kLong));
  Number number;
  uint64_t count = 0;
  uint64_t bad = 0;
  while (reader.Read(&number)) {
    ++count;
    if (number.value() != count || number.pad().size() != 64 * 1024) ++bad;
  }
  CHECK(reader.Finish().ok());
  CHECK(count == 200);
  CHECK(bad == 0);
  f.RequireAllEnded(1);
}

TEST_CASE("async server stream: a handler that drops its stream unfinished answers INTERNAL",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  CountRequest request = Counting(100);
  request.set_fail_after(-5);
  zrpc::ClientReader<Number> reader = stub.Count(request, CallOptions::Timeout(kLong));
  Number number;
  uint64_t count = 0;
  while (reader.Read(&number)) ++count;
  const absl::Status status = reader.Finish();
  CHECK(count == 5);
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(std::string(status.message()).find("dropped the stream without finishing it") !=
        std::string::npos);
  f.RequireAllEnded(1);

  // And one that finishes with an error mid-stream: the status reaches the client.
  request.set_fail_after(7);
  zrpc::ClientReader<Number> failing = stub.Count(request, CallOptions::Timeout(kLong));
  count = 0;
  while (failing.Read(&number)) ++count;
  const absl::Status aborted = failing.Finish();
  CHECK(count == 7);
  CHECK(aborted.code() == absl::StatusCode::kAborted);
  f.RequireAllEnded(2);
}

TEST_CASE("async server stream: a client that cancels mid-stream fails the handler's Write",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReader<Number> reader =
      stub.Count(Counting(100'000'000), CallOptions::Timeout(kLong));
  Number number;
  for (int i = 0; i < 10; ++i) REQUIRE(reader.Read(&number));
  reader.Cancel();
  CHECK(reader.Finish().code() == absl::StatusCode::kCancelled);
  CHECK(zrpc::testing::Eventually([&] { return f.service.stopped.load() == 1; }));
  f.RequireAllEnded(1);
}

TEST_CASE("async bidirectional: Finish with a Read outstanding completes that Read with false",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
  Number number;
  number.set_value(21);
  REQUIRE(chat.Write(number));
  REQUIRE(chat.Read(&number));
  CHECK(number.value() == 42);
  number.set_value(0);
  REQUIRE(chat.Write(number));
  CHECK(!chat.Read(&number));
  const absl::Status status = chat.Finish();
  CHECK(status.code() == absl::StatusCode::kAborted);
  CHECK(zrpc::testing::Eventually([&] { return f.service.late_reads.load() == 1; }));
  f.RequireAllEnded(1);
}

TEST_CASE("Shutdown during an async stream whose client stopped reading ends it",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReader<Number> reader =
      stub.Count(Counting(100'000'000), CallOptions::Timeout(kLong));
  Number number;
  REQUIRE(reader.Read(&number));
  // The handler's Write waits for the client's room, which never comes: Shutdown's grace runs
  // out, the runtime answers for the call and ends its stream, and the handler's Write fails.
  f.server->Shutdown(absl::Milliseconds(200));
  CHECK(f.service.stopped.load() == 1);
  CHECK(f.service.ended.load() == 1);
  CHECK(f.server->stats().calls_in_flight == 0);
  while (reader.Read(&number)) {
  }
  CHECK(!reader.Finish().ok());
}

// A Count call the test thread serves itself: it writes until the client's window is full and
// one Write is left outstanding, then drops the writer (after Finish(OK) when `finish`). The
// client reads what was sent and returns the final status.
absl::Status DropWithWriteOutstanding(const zrpc::transport::DeviceConfig& config, bool finish) {
  AsyncFixture f(config);
  absl::Mutex mu;
  std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> writer;
  f.service.take_count = [&](auto call) {
    absl::MutexLock lock(&mu);
    writer = std::move(call);
  };
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReader<Number> reader = stub.Count(Counting(1'000), CallOptions::Timeout(kLong));
  REQUIRE(zrpc::testing::Eventually([&] {
    absl::MutexLock lock(&mu);
    return writer != nullptr;
  }));
  absl::MutexLock lock(&mu);
  Number number;
  std::atomic<int> completed{0};
  // The client grants its window (16) at the open and reads nothing until the writer is gone:
  // 16 Writes complete, the 17th waits for room.
  constexpr int kWindow = 16;
  for (int i = 1; i <= kWindow + 1; ++i) {
    number.set_value(i);
    writer->Write(number, [&completed](bool ok) { completed.fetch_add(ok ? 1 : 1000); });
    if (i <= kWindow) {
      REQUIRE(zrpc::testing::Eventually([&] { return completed.load() == i; }));
    }
  }
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(completed.load() == kWindow);  // the last Write is outstanding
  if (finish) writer->Finish(absl::OkStatus());
  writer.reset();  // this thread is not the pump's: the destructor drops the Write
  CHECK(completed.load() == kWindow);  // its callback never runs
  int read = 0;
  while (reader.Read(&number)) ++read;
  CHECK(read == kWindow);
  const absl::Status status = reader.Finish();
  CHECK(zrpc::testing::Eventually([&] { return f.server->stats().calls_in_flight == 0; }));
  CHECK(completed.load() == kWindow);
  return status;
}

TEST_CASE("an async writer dropped with a Write outstanding: after Finish(OK), ABORTED",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  const absl::Status status = DropWithWriteOutstanding(config, /*finish=*/true);
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kAborted);
  CHECK(std::string(status.message()).find("Write outstanding") != std::string::npos);
}

TEST_CASE("an async writer dropped unfinished with a Write outstanding: INTERNAL",
          "[async_server_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  const absl::Status status = DropWithWriteOutstanding(config, /*finish=*/false);
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kInternal);
}

TEST_CASE("an async Finish behind a Write credits back what the client goes on writing",
          "[async_server_streaming]") {
  // The client writes 200 numbers and reads only after its WritesDone; the handler (this
  // thread) reads nothing, writes until one Write waits for the client's room, then finishes.
  // Its answer waits for that Write, and the Write for the client, which is blocked writing:
  // what the server drops unread must be credited back, also what arrives after the Finish,
  // or both ends wait for the deadline.
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  absl::Mutex mu;
  std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> handler;
  f.service.take_double = [&](auto call) {
    absl::MutexLock lock(&mu);
    handler = std::move(call);
  };
  Numbers::Stub stub(f.channel.get());
  zrpc::ClientReaderWriter<Number, Number> chat = stub.Double(CallOptions::Timeout(kLong));
  constexpr int kWrites = 200;
  std::atomic<int> written{0};
  std::thread writer([&] {
    Number n;
    for (int i = 1; i <= kWrites; ++i) {
      n.set_value(i);
      if (!chat.Write(n)) break;
      written.fetch_add(1);
    }
    chat.WritesDone();
  });
  REQUIRE(zrpc::testing::Eventually([&] {
    absl::MutexLock lock(&mu);
    return handler != nullptr;
  }));
  constexpr int kWindow = 16;  // the client's, granted at the open
  Number out;
  std::atomic<int> completed{0};
  {
    absl::MutexLock lock(&mu);
    for (int i = 1; i <= kWindow + 1; ++i) {
      out.set_value(i);
      handler->Write(out, [&completed](bool ok) { completed.fetch_add(ok ? 1 : 1000); });
      if (i <= kWindow) {
        REQUIRE(zrpc::testing::Eventually([&] { return completed.load() == i; }));
      }
    }
    handler->Finish(absl::OkStatus());  // behind the 17th Write
  }
  writer.join();
  CHECK(written.load() == kWrites);
  Number number;
  int read = 0;
  while (chat.Read(&number)) ++read;
  const absl::Status status = chat.Finish();
  INFO(status);
  CHECK(status.ok());
  CHECK(read == kWindow + 1);
  CHECK(completed.load() == kWindow + 1);
  {
    absl::MutexLock lock(&mu);
    handler.reset();
  }
  CHECK(zrpc::testing::Eventually([&] { return f.server->stats().calls_in_flight == 0; }));
}

TEST_CASE("an async stream whose client never cancels ends at its deadline",
          "[async_server_streaming][hostile]") {
  // A raw client opens a stream with a 300 ms deadline, takes one number and then neither
  // grants more nor cancels: the handler's Write waits for room that never comes. With no
  // thread whose wait ends at the deadline, the server's sweeper ends the stream then.
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  AsyncFixture f(config);
  zrpc_test::RawClient raw;  // outlives the peer's poller, which reports its connection's close
  zrpc::testing::TransportPeer peer(config);
  auto connection = peer.Connect(config.addr, f.server->port(), &raw);
  REQUIRE(connection.ok());
  REQUIRE(zrpc_test::SendRaw(**connection,
                             zrpc::RpcHeader::StreamOpen(zrpc_test::kNumbersId,
                                                         zrpc_test::kCountIndex, 1, 300'000, 1),
                             Counting(1'000'000).SerializeAsString())
              .ok());
  CHECK(zrpc::testing::Eventually([&] { return raw.Count(zrpc::RpcKind::kStreamMessage) == 1; }));
  CHECK(zrpc::testing::Eventually(
      [&] { return f.service.stopped.load() == 1 && f.server->stats().calls_in_flight == 0; }));
  CHECK(f.service.ended.load() == 1);
  CHECK_FALSE(raw.closed.HasBeenNotified());
  (*connection)->Close();
  REQUIRE(raw.closed.WaitForNotificationWithTimeout(kLong));  // `raw` must outlive that
  connection->reset();
}

TEST_CASE("async bidirectional written from the poller while the client holds its receives",
          "[async_server_streaming][hostile]") {
  // A raw client that stops giving its receives back for a while (its poller lags): the
  // server's doubled numbers, written from read callbacks on its poller, wait for the client's
  // credits, and the server's reads stall with them (the client's numbers need the credits the
  // server's frames carry back). The poller never waits. Once the client catches up, every
  // number arrives, in order. (This takes no send slot from a frame: instrumented, about 30
  // frames go before the stall and no send is refused.)
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions options;
  options.stream_window = 1000;
  AsyncFixture f(config, options);
  zrpc_test::RawClient raw;  // outlives the peer's poller, which reports its connection's close
  zrpc::testing::TransportPeer peer(config);
  raw.hold = true;
  auto connection = peer.Connect(config.addr, f.server->port(), &raw);
  REQUIRE(connection.ok());
  REQUIRE(zrpc_test::SendRaw(**connection,
                             zrpc::RpcHeader::StreamOpen(zrpc_test::kNumbersId,
                                                         zrpc_test::kDoubleIndex, 1, 0, 1000))
              .ok());
  // The server's grant of its window comes when the handler opens the stream.
  REQUIRE(zrpc::testing::Eventually([&] { return raw.Count(zrpc::RpcKind::kStreamCredit) >= 1; }));
  constexpr int kCount = 600;
  Number number;
  for (int i = 1; i <= kCount; ++i) {
    number.set_value(i);
    REQUIRE(zrpc_test::SendRaw(**connection, zrpc::RpcHeader::StreamMessage(1),
                               number.SerializeAsString())
                .ok());
  }
  REQUIRE(zrpc_test::SendRaw(**connection, zrpc::RpcHeader::HalfClose(1)).ok());
  absl::SleepFor(absl::Milliseconds(300));  // the server's frames pile up meanwhile
  raw.Unhold(**connection);
  CHECK(zrpc::testing::Eventually([&] { return raw.Count(zrpc::RpcKind::kResponse) == 1; }));
  CHECK(raw.Count(zrpc::RpcKind::kStreamMessage) == kCount);
  CHECK(raw.Count(zrpc::RpcKind::kError, absl::StatusCode::kResourceExhausted) == 0);
  CHECK_FALSE(raw.closed.HasBeenNotified());
  CHECK(f.server->stats().protocol_violations == 0);
  f.RequireAllEnded(1);
  (*connection)->Close();
  REQUIRE(raw.closed.WaitForNotificationWithTimeout(kLong));
  connection->reset();
}

}  // namespace
