// The asynchronous form of client streams (rpc/streaming.h, "Asynchronous streams") on a device
// (tag "rdma"): each kind driven from its own callbacks only, order, callbacks that never nest
// or overlap, writes that wait for the server's room and (larger than a slot) for the staging
// quota on a runtime thread, cancel, deadline, destruction with a callback outstanding or from
// inside one, and misuse. Callbacks record what they saw; the test thread checks it (Catch2's
// assertions are not for other threads).
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
  // Connected first, and a deadline of 1 s: the server runs no handler for a call whose deadline
  // passed before it got to it, and a first connect under ASan took most of 300 ms (the handler
  // never ran, and `stopped` stayed 0).
  REQUIRE(f.channel->Connect(absl::Now() + kLong).ok());
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
        stub.AsyncCount(slow, CallOptions::Timeout(absl::Seconds(1)));
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
      zrpc::AsyncClientReader<Number> reader = stub.AsyncCount(slow, CallOptions::Timeout(kLong));
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

// Takes every send slot of the channel's connection: the server holds its unary calls (all its
// receive credits for the connection), so the next requests wait for credits in the client's
// send slots until all `slots` are taken; a thread keeps asking for more meanwhile. Open() lets
// everything go.
class SlotFiller {
 public:
  SlotFiller(Fixture& f, Numbers::Stub& stub) : f_(f), stub_(stub) {
    f_.service.square_gate = &gate_;
  }
  ~SlotFiller() {
    Open();
    if (caller_.joinable()) caller_.join();
    // The calls' replies and callbacks are this object's: every call ends before it goes.
    static_cast<void>(zrpc::testing::Eventually([this] { return ended_.load() == kCalls; }, kWait));
    f_.service.square_gate = nullptr;
  }
  // Returns once the caller is stuck: no new call for 300 ms.
  void Fill() {
    caller_ = std::thread([this] {
      Number request;
      request.set_value(3);
      for (Number& reply : replies_) {
        stub_.AsyncSquare(request, &reply, CallOptions::Timeout(kLong),
                          [this](absl::Status status) {
                            answered_.fetch_add(status.ok());
                            ended_.fetch_add(1);
                          });
      }
    });
    // More than the slots' worth out.
    const uint64_t in_flight = zrpc_test::WaitUntilStuck(
        [this] { return f_.channel->stats().calls_in_flight; }, 40, kWait);
    INFO("calls in flight: " << in_flight);
    REQUIRE(in_flight < 1 + kCalls + 2);
  }
  void Open() {
    if (!gate_.HasBeenNotified()) gate_.Notify();
  }
  int answered() const { return answered_.load(); }
  static constexpr int kCalls = 100;

 private:
  Fixture& f_;
  Numbers::Stub& stub_;
  absl::Notification gate_;
  std::vector<Number> replies_ = std::vector<Number>(kCalls);
  std::atomic<int> answered_{0};
  std::atomic<int> ended_{0};
  std::thread caller_;
};

zrpc::ChannelOptions FortySlots() {
  zrpc::ChannelOptions options;
  options.connection.max_send_slots = 40;
  return options;
}

TEST_CASE("credits a read loop owes wait for a send slot on the poller, then go",
          "[async_streaming]") {
  // The server trickles numbers; the loop reads each from its callback on the poller, which
  // owes the server a credit every 8. Meanwhile every send slot is taken: the credit waits for
  // one (before: the stream failed RESOURCE_EXHAUSTED), and goes once slots come back.
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config, {}, FortySlots());
  Numbers::Stub stub(f.channel.get());
  zrpc::examples::CountRequest trickle = Counting(200);
  trickle.set_delay_us(20'000);
  zrpc::AsyncClientReader<Number> reader = stub.AsyncCount(trickle, CallOptions::Timeout(kLong));
  Serial serial;
  ReadLoop loop;
  loop.reader = &reader;
  loop.serial = &serial;
  loop.Start();  // nothing is there yet: the callbacks run on the poller as numbers come
  {
    SlotFiller filler(f, stub);
    filler.Fill();
    absl::SleepFor(absl::Milliseconds(500));  // credits come due while no slot is free
    CHECK_FALSE(loop.ended.HasBeenNotified());
    filler.Open();
    CHECK(zrpc::testing::Eventually([&] { return filler.answered() == SlotFiller::kCalls; }));
  }
  REQUIRE(loop.ended.WaitForNotificationWithTimeout(kWait));
  Finished finished;
  reader.Finish(finished.Callback());
  const absl::Status status = finished.Wait();
  INFO(status);
  CHECK(status.ok());
  CHECK(loop.count == 200);
  CHECK(loop.out_of_order == 0);
  CHECK(serial.overlaps.load() == 0);
}

TEST_CASE("destroying a stream whose Write waits for a send slot returns at once",
          "[async_streaming]") {
  // The Write, started on a thread of the test, waits there for a slot; the stream is destroyed
  // from another thread. The destructor used to wait for that Write to end, which waited for
  // a slot that only the held calls would free.
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Fixture f(config, {}, FortySlots());
  Numbers::Stub stub(f.channel.get());
  Total total;
  auto writer = std::make_unique<zrpc::AsyncClientWriter<Number>>(
      stub.AsyncSum(&total, CallOptions::Timeout(kLong)));
  Number first;
  first.set_value(1);
  absl::Notification written;
  writer->Write(first, [&](bool ok) {
    if (ok) written.Notify();
  });
  REQUIRE(written.WaitForNotificationWithTimeout(kWait));  // the server's window is here
  SlotFiller filler(f, stub);
  filler.Fill();
  Number second;
  second.set_value(2);
  std::atomic<int> second_callbacks{0};
  absl::Notification writing;
  std::thread blocked([&] {
    zrpc::AsyncClientWriter<Number>* w = writer.get();
    writing.Notify();
    w->Write(second, [&](bool) { second_callbacks.fetch_add(1); });
  });
  // The Write is under way (it must be inside before the destructor starts: calling into an
  // object being destroyed is the test's own fault), and then waits for a slot.
  REQUIRE(writing.WaitForNotificationWithTimeout(kWait));
  absl::SleepFor(absl::Seconds(1));
  absl::Notification destroyed;
  std::thread destroyer([&] {
    writer.reset();
    destroyed.Notify();
  });
  const bool prompt = destroyed.WaitForNotificationWithTimeout(absl::Seconds(10));
  filler.Open();  // in any case, or the threads below would wait for it
  destroyer.join();
  blocked.join();
  CHECK(prompt);
  CHECK(second_callbacks.load() == 0);
}

}  // namespace
