// The asynchronous form of server streams (an AsyncService's streaming handlers: rpc/streaming.h,
// "Asynchronous server streams") on a device (tag "rdma"): each kind served from callbacks only,
// with no thread per stream (more streams open at once than ServerOptions::max_streams allows
// threads), order, callbacks that never nest or overlap, large messages written from the
// poller (the staging quota waited for without blocking it), a handler that drops its stream
// unfinished, a client that cancels, a Finish with a Read outstanding, and Shutdown during a
// stream. Handlers record what they saw; the test thread checks it.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
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
    (new Counter(this, std::move(call)))->Next();
  }
  void Sum(std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> call) override {
    (new Summer(this, std::move(call)))->Next();
  }
  void Double(std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> call) override {
    (new Doubler(this, std::move(call)))->Next();
  }

  std::atomic<uint64_t> written{0};
  std::atomic<int> stopped{0};   // a Write that failed: the client went or gave up
  std::atomic<int> ended{0};     // handlers done with their stream (finished or dropped)
  std::atomic<int> overlaps{0};  // callbacks of one stream that nested or overlapped
  std::atomic<int> late_reads{0};  // Reads outstanding at Finish that completed with false
};

Counter::Counter(AsyncNumbers* s,
                 std::unique_ptr<zrpc::ServerAsyncWriter<CountRequest, Number>> c)
    : service(s), call(std::move(c)) {
  serial.overlaps = &s->overlaps;
  number.set_pad(std::string(call->request().pad_bytes(), 'p'));
}

Summer::Summer(AsyncNumbers* s, std::unique_ptr<zrpc::ServerAsyncReader<Number, Total>> c)
    : service(s), call(std::move(c)) {
  serial.overlaps = &s->overlaps;
}

Doubler::Doubler(AsyncNumbers* s,
                 std::unique_ptr<zrpc::ServerAsyncReaderWriter<Number, Number>> c)
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
    CHECK(zrpc::testing::Eventually([&] {
      return service.ended.load() == streams && server->stats().calls_in_flight == 0;
    }));
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
  for (uint64_t i = 1; i <= 5'000; ++i) {
    number.set_value(i);
    REQUIRE(writer.Write(number));
  }
  CHECK(writer.WritesDone());
  REQUIRE(writer.Finish().ok());
  CHECK(total.count() == 5'000);
  CHECK(total.sum() == 5'000ull * 5'001 / 2);
  f.RequireAllEnded(1);
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

}  // namespace
