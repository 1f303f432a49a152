// The asynchronous form of client streams (rpc/streaming.h, "Asynchronous streams") on a device
// (tag "rdma"): each kind driven from its own callbacks only, order, callbacks that never nest
// or overlap, writes that wait for the server's room and (larger than a slot) for the staging
// quota on a runtime thread, cancel, deadline, destruction with a callback outstanding or from
// inside one, and misuse. Callbacks record what they saw; the test thread checks it (Catch2's
// assertions are not for other threads).
#include <catch2/catch.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/eventually.h"
#include "tests/rdma_device.h"
#include "tests/rpc/numbers_fixture.h"

namespace {

using zrpc::CallOptions;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;
using zrpc_test::Counting;
using Fixture = zrpc_test::NumbersFixture;

constexpr absl::Duration kLong = absl::Seconds(120);
constexpr absl::Duration kWait = absl::Seconds(120);

// The final status, from a Finish callback.
struct Finished {
  absl::Notification done;
  absl::Status status;
  zrpc::DoneCallback Callback() {
    return [this](absl::Status s) {
      status = std::move(s);
      done.Notify();
    };
  }
  absl::Status Wait() {
    REQUIRE(done.WaitForNotificationWithTimeout(kWait));
    return status;
  }
};

// Catches callbacks of one stream that nest or overlap: each callback enters and leaves.
struct Serial {
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  void Enter() {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
  }
  void Leave() { inside.fetch_sub(1); }
};

// Reads a server stream to its end from its own callbacks: each Read's callback starts the next.
struct ReadLoop {
  zrpc::AsyncClientReader<Number>* reader = nullptr;
  Serial* serial = nullptr;
  Number number;
  uint64_t next = 1;
  uint64_t count = 0;
  uint64_t out_of_order = 0;
  absl::Notification ended;

  void Start() {
    reader->Read(&number, [this](bool ok) { OnRead(ok); });
  }
  void OnRead(bool ok) {
    serial->Enter();
    if (!ok) {
      serial->Leave();
      ended.Notify();
      return;
    }
    if (number.value() != next) ++out_of_order;
    ++next;
    ++count;
    Start();  // completes after this callback returns, never inside it
    serial->Leave();
  }
};

TEST_CASE("async server streaming: 20,000 numbers read from callbacks, in order, never nested",
          "[async_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::AsyncClientReader<Number> reader =
      stub.AsyncCount(Counting(20'000), CallOptions::Timeout(kLong));
  Serial serial;
  ReadLoop loop;
  loop.reader = &reader;
  loop.serial = &serial;
  loop.Start();
  REQUIRE(loop.ended.WaitForNotificationWithTimeout(kWait));
  Finished finished;
  reader.Finish(finished.Callback());
  CHECK(finished.Wait().ok());
  CHECK(loop.count == 20'000);
  CHECK(loop.out_of_order == 0);
  CHECK(serial.overlaps.load() == 0);
  CHECK(zrpc::testing::Eventually([&] { return f.server->stats().streams_open == 0; }));
}

// Writes `total` numbers from the write callbacks (value i + 1, `pad` bytes each), then
// half-closes.
struct WriteLoop {
  std::function<void(const Number&, zrpc::StreamCallback)> write;
  std::function<void()> writes_done;
  Serial* serial = nullptr;
  Number number;
  uint64_t total = 0;
  uint64_t sent = 0;
  bool failed = false;
  absl::Notification ended;

  void Start() {
    number.set_value(sent + 1);
    write(number, [this](bool ok) { OnWritten(ok); });
  }
  void OnWritten(bool ok) {
    serial->Enter();
    if (!ok) failed = true;
    if (ok && ++sent < total) {
      Start();
    } else {
      writes_done();
      ended.Notify();
    }
    serial->Leave();
  }
};

TEST_CASE("async client streaming: 5,000 numbers written from callbacks, then the sum",
          "[async_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  Total total;
  zrpc::AsyncClientWriter<Number> writer = stub.AsyncSum(&total, CallOptions::Timeout(kLong));
  Serial serial;
  WriteLoop loop;
  loop.write = [&writer](const Number& n, zrpc::StreamCallback done) {
    writer.Write(n, std::move(done));
  };
  loop.writes_done = [&writer] { writer.WritesDone(); };
  loop.serial = &serial;
  loop.total = 5'000;
  // The server grants its window only when its handler starts: the first writes wait for it,
  // and go from the poller that brings it (without a send slot held meanwhile).
  loop.Start();
  REQUIRE(loop.ended.WaitForNotificationWithTimeout(kWait));
  Finished finished;
  writer.Finish(finished.Callback());
  CHECK(finished.Wait().ok());
  CHECK_FALSE(loop.failed);
  CHECK(loop.sent == 5'000);
  CHECK(total.count() == 5'000);
  CHECK(total.sum() == 5'000ull * 5'001 / 2);
  CHECK(serial.overlaps.load() == 0);
}

// Bidirectional: writes and reads, each from its own callbacks, at once; the server doubles.
void RunBidi(Fixture& f, uint64_t count, size_t pad_bytes) {
  Numbers::Stub stub(f.channel.get());
  zrpc::AsyncClientReaderWriter<Number, Number> stream =
      stub.AsyncDouble(CallOptions::Timeout(kLong));
  Serial serial;
  WriteLoop writes;
  writes.number.set_pad(std::string(pad_bytes, 'w'));
  writes.write = [&stream](const Number& n, zrpc::StreamCallback done) {
    stream.Write(n, std::move(done));
  };
  writes.writes_done = [&stream] { stream.WritesDone(); };
  writes.serial = &serial;
  writes.total = count;

  struct Reads {
    zrpc::AsyncClientReaderWriter<Number, Number>* stream = nullptr;
    Serial* serial = nullptr;
    Number number;
    uint64_t next = 1;
    uint64_t count = 0;
    uint64_t wrong = 0;
    size_t pad_bytes = 0;
    absl::Notification ended;
    void Start() {
      stream->Read(&number, [this](bool ok) {
        serial->Enter();
        if (ok) {
          if (number.value() != 2 * next || number.pad().size() != pad_bytes) ++wrong;
          ++next;
          ++count;
          Start();
        } else {
          ended.Notify();
        }
        serial->Leave();
      });
    }
  } reads;
  reads.stream = &stream;
  reads.serial = &serial;
  reads.pad_bytes = pad_bytes;

  reads.Start();
  writes.Start();
  REQUIRE(writes.ended.WaitForNotificationWithTimeout(kWait));
  REQUIRE(reads.ended.WaitForNotificationWithTimeout(kWait));
  Finished finished;
  stream.Finish(finished.Callback());
  CHECK(finished.Wait().ok());
  CHECK_FALSE(writes.failed);
  CHECK(writes.sent == count);
  CHECK(reads.count == count);
  CHECK(reads.wrong == 0);
  CHECK(serial.overlaps.load() == 0);
}

TEST_CASE("async bidirectional: writes and reads from callbacks at once", "[async_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  RunBidi(f, 2'000, 0);
}

TEST_CASE("async writes larger than a slot, from the poller, wait for the staging quota",
          "[async_streaming]") {
  // 64 KiB messages: the staging quota (the server's 256 KiB arena) holds a few; written one
  // after another from callbacks on the poller, which cannot wait for the quota it frees, the
  // next ones wait to be told it came back (they failed RESOURCE_EXHAUSTED before).
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  RunBidi(f, 200, 64 * 1024);
}

TEST_CASE("async cancel and deadline end the call: the callbacks see it, the server stops",
          "[async_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::examples::CountRequest slow = Counting(1'000'000);
  slow.set_delay_us(2'000);
  SECTION("cancel") {
    zrpc::AsyncClientReader<Number> reader = stub.AsyncCount(slow, CallOptions::Timeout(kLong));
    Number number;
    absl::Notification first;
    reader.Read(&number, [&](bool ok) {
      if (ok) first.Notify();
    });
    REQUIRE(first.WaitForNotificationWithTimeout(kWait));
    std::atomic<int> reads{0};
    std::atomic<bool> last_ok{true};
    absl::Notification read_done;
    reader.Read(&number, [&](bool ok) {
      reads.fetch_add(1);
      last_ok = ok;
      read_done.Notify();
    });
    reader.Cancel();
    Finished finished;
    reader.Finish(finished.Callback());
    CHECK(finished.Wait().code() == absl::StatusCode::kCancelled);
    // Finish's callback comes after the outstanding Read's (false, or one that raced in).
    CHECK(read_done.HasBeenNotified());
    CHECK(reads.load() == 1);
  }
  SECTION("deadline") {
    zrpc::AsyncClientReader<Number> reader =
        stub.AsyncCount(slow, CallOptions::Timeout(absl::Milliseconds(300)));
    Serial serial;
    ReadLoop loop;
    loop.reader = &reader;
    loop.serial = &serial;
    loop.Start();
    REQUIRE(loop.ended.WaitForNotificationWithTimeout(kWait));
    Finished finished;
    reader.Finish(finished.Callback());
    CHECK(finished.Wait().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(loop.out_of_order == 0);
  }
  CHECK(zrpc::testing::Eventually([&] { return f.service.stopped.load() == 1; }));
  CHECK(zrpc::testing::Eventually([&] { return f.server->stats().streams_open == 0; }));
  CHECK(zrpc::testing::Eventually([&] { return f.channel->stats().calls_in_flight == 0; }));
}

TEST_CASE("destroying an async stream cancels it and drops its callbacks; also from inside one",
          "[async_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::examples::CountRequest slow = Counting(1'000'000);
  slow.set_delay_us(50'000);
  SECTION("a Read outstanding: its callback never runs") {
    std::atomic<int> callbacks{0};
    {
      zrpc::AsyncClientReader<Number> reader =
          stub.AsyncCount(slow, CallOptions::Timeout(kLong));
      Number number;
      absl::Notification first;
      reader.Read(&number, [&](bool) { first.Notify(); });
      REQUIRE(first.WaitForNotificationWithTimeout(kWait));
      // The next number is 50 ms away: this Read is outstanding when the reader goes.
      reader.Read(&number, [&](bool) { callbacks.fetch_add(1); });
    }
    absl::SleepFor(absl::Milliseconds(200));
    CHECK(callbacks.load() == 0);
  }
  SECTION("from its own Finish callback, on a runtime thread") {
    auto reader = std::make_unique<zrpc::AsyncClientReader<Number>>(
        stub.AsyncCount(Counting(100), CallOptions::Timeout(kLong)));
    Serial serial;
    ReadLoop loop;
    loop.reader = reader.get();
    loop.serial = &serial;
    loop.Start();
    REQUIRE(loop.ended.WaitForNotificationWithTimeout(kWait));
    absl::Notification destroyed;
    absl::Status status;
    zrpc::AsyncClientReader<Number>* raw = reader.get();
    raw->Finish([&, owned = std::move(reader)](absl::Status s) mutable {
      status = s;
      owned.reset();  // the stream goes from inside its own callback
      destroyed.Notify();
    });
    REQUIRE(destroyed.WaitForNotificationWithTimeout(kWait));
    CHECK(status.ok());
    CHECK(loop.count == 100);
  }
  CHECK(zrpc::testing::Eventually([&] { return f.server->stats().streams_open == 0; }));
  CHECK(zrpc::testing::Eventually([&] { return f.channel->stats().calls_in_flight == 0; }));
}

TEST_CASE("async misuse fails at once: a second Read, a Write after WritesDone, Finish twice",
          "[async_streaming]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config);
  Numbers::Stub stub(f.channel.get());
  zrpc::AsyncClientReaderWriter<Number, Number> stream =
      stub.AsyncDouble(CallOptions::Timeout(kLong));
  Number first;
  Number second;
  std::atomic<int> first_calls{0};
  std::atomic<bool> first_ok{true};
  absl::Notification first_done;
  // Nothing written: the server sends nothing, and this Read stays outstanding.
  stream.Read(&first, [&](bool ok) {
    first_calls.fetch_add(1);
    first_ok = ok;
    first_done.Notify();
  });
  std::atomic<int> second_calls{0};
  bool second_ok = true;
  stream.Read(&second, [&](bool ok) {
    second_calls.fetch_add(1);
    second_ok = ok;
  });
  CHECK(second_calls.load() == 1);  // at once, on this thread
  CHECK_FALSE(second_ok);
  CHECK(first_calls.load() == 0);

  stream.WritesDone();
  bool late_ok = true;
  int late_calls = 0;
  Number late;
  late.set_value(7);
  stream.Write(late, [&](bool ok) {
    ++late_calls;
    late_ok = ok;
  });
  CHECK(late_calls == 1);
  CHECK_FALSE(late_ok);

  // The half-close ends the server's loop: its OK ends the outstanding Read with false.
  REQUIRE(first_done.WaitForNotificationWithTimeout(kWait));
  CHECK_FALSE(first_ok.load());
  CHECK(first_calls.load() == 1);
  Finished finished;
  stream.Finish(finished.Callback());
  CHECK(finished.Wait().ok());
  Finished again;
  stream.Finish(again.Callback());
  CHECK(again.Wait().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
