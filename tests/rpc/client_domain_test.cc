// A client's calls live in their transport connection's domain (rpc/client/client_connection.h):
// a call started on an application thread while the poller holds the domain (a done-callback
// still running) is left there and goes when the poller lets go, the starting thread never
// waiting; a stream's frames never overtake its opening left that way; a call that fails inside
// the domain on an application thread runs its callback after that thread lets go, so the
// callback may make a blocking call on the same connection; a stream destroyed on its own poller
// while an application thread holds the domain does not stall that poller; requests started on a
// runtime thread past the waiting queue's bound are refused at once, once each, and those with
// metadata wait with their metadata block (small, and larger than a slot); an asynchronous
// stream's pump sends what waited for its opening; a callback holding its poller does not hold
// up the channel's timer; a frame a pump sends from a runtime thread while every send slot is
// taken goes when a send completion frees one, with no timer's help. Over fakeverbs with the
// pollers on their own threads: on the host and under ASan.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/examples/numbers.zrpc.h"
#include "tests/eventually.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/rpc/numbers_fixture.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/slot_retry.h"

namespace {

using zrpc::CallOptions;
using zrpc::fakeverbs::FakeDevice;
using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HoldingGreeter;
using zrpc::testing::Named;
using zrpc::testing::Served;

// One connection, so every call below shares one domain.
zrpc::ChannelOptions OneConnection() {
  zrpc::ChannelOptions options;
  options.connections = 1;
  return options;
}

// An asynchronous Ping whose callback holds the client's poller (and with it the connection's
// domain) until `go`.
struct HeldCallback {
  absl::Notification in_callback, go, returned;
  absl::Status status;
  google::protobuf::Empty request, reply;

  void Start(Greeter::Stub& stub) {
    stub.AsyncPing(request, &reply, CallOptions::Timeout(absl::Seconds(30)),
                   [this](absl::Status s) {
                     status = std::move(s);
                     in_callback.Notify();
                     go.WaitForNotification();
                     returned.Notify();
                   });
    REQUIRE(in_callback.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
};

}  // namespace

TEST_CASE(
    "a call started while a callback holds the connection's domain is left there, and goes when "
    "the callback returns",
    "[client_domain]") {
  HoldingGreeter greeter;
  Served served(FakeDevice(), {&greeter}, {}, OneConnection());
  Greeter::Stub stub(served.channel.get());
  google::protobuf::Empty request, reply;
  REQUIRE(stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(30))).ok());  // connected
  HeldCallback held;
  held.Start(stub);
  CHECK(held.status.ok());
  // The poller is in its batch, in the callback: these return at once (a start that waited for
  // the domain would never return, the callback waiting for this thread).
  constexpr int kCalls = 8;
  std::atomic<int> ok{0}, ended{0};
  std::vector<google::protobuf::Empty> replies(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    stub.AsyncPing(request, &replies[i], CallOptions::Timeout(absl::Seconds(30)),
                   [&](absl::Status s) {
                     ok += s.ok() ? 1 : 0;
                     ++ended;
                   });
  }
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(ended.load() == 0);  // not sent yet: the domain is held
  CHECK(served.channel->stats().calls_in_flight <= 1);
  held.go.Notify();
  REQUIRE(held.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(zrpc::testing::Eventually([&] { return ended.load() == kCalls; }));
  CHECK(ok.load() == kCalls);
  CHECK(zrpc::testing::Eventually([&] { return served.channel->stats().calls_in_flight == 0; }));
}

TEST_CASE(
    "a call refused inside the domain on an application thread runs its callback after the "
    "thread lets go; a blocking call made there succeeds",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc::ChannelOptions options = OneConnection();
  options.max_calls_per_connection = 2;
  // Nothing of the runtime's own on the connection (pings), so that the poller is idle, the
  // domain free, when the third call starts: it runs on this thread.
  options.keepalive_interval = absl::ZeroDuration();
  Served served(FakeDevice(), {&greeter}, {}, options);
  Greeter::Stub stub(served.channel.get());
  HelloReply first, second, third;
  std::atomic<int> held_ok{0};
  auto count = [&](absl::Status s) { held_ok += s.ok() ? 1 : 0; };
  stub.AsyncSayHello(Named("a"), &first, CallOptions::Timeout(absl::Seconds(30)), count);
  stub.AsyncSayHello(Named("b"), &second, CallOptions::Timeout(absl::Seconds(30)), count);
  REQUIRE(zrpc::testing::Eventually([&] { return greeter.held() == 2; }));
  absl::SleepFor(absl::Milliseconds(50));  // the sends' completions handled
  // The table is full: this one is refused in the domain, on this thread (the domain is free).
  absl::Status refused, inner;
  bool answered = false;
  absl::Notification done;
  stub.AsyncSayHello(
      Named("c"), &third, CallOptions::Timeout(absl::Seconds(30)), [&](absl::Status s) {
        refused = std::move(s);
        // The held calls answered: their answers come through the domain, which
        // this thread must not hold any more; then a blocking call on the same
        // connection.
        greeter.Release();
        answered =
            zrpc::testing::Eventually([&] { return held_ok.load() == 2; }, absl::Seconds(10));
        google::protobuf::Empty request, reply;
        inner = stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(10)));
        done.Notify();
      });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(answered);
  INFO(inner);
  CHECK(inner.ok());
}

TEST_CASE(
    "a stream opened while the domain is held sends its half-close after its opening, never "
    "before",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc_test::TestNumbers numbers;
  Served served(FakeDevice(), {&greeter, &numbers}, {}, OneConnection());
  Greeter::Stub greeter_stub(served.channel.get());
  zrpc::examples::Numbers::Stub numbers_stub(served.channel.get());
  google::protobuf::Empty request, reply;
  REQUIRE(greeter_stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(30))).ok());
  HeldCallback held;
  held.Start(greeter_stub);
  zrpc::examples::Total total;
  // Opened now, its start left in the domain. The half-close needs no credit from the server
  // (a message would wait for one, which only the opening brings): it waits here for the opening
  // to go, which happens when the callback lets go, a moment later. Sent first, it would reach
  // the server for a call it does not know.
  zrpc::ClientWriter<zrpc::examples::Number> writer =
      numbers_stub.Sum(&total, CallOptions::Timeout(absl::Seconds(30)));
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(100));
    held.go.Notify();
  });
  CHECK(writer.WritesDone());
  const absl::Status status = writer.Finish();
  release.join();
  INFO(status);
  CHECK(status.ok());
  CHECK(total.count() == 0);
  // And the connection is sound: a stream of 100 numbers after it.
  zrpc::ClientWriter<zrpc::examples::Number> more =
      numbers_stub.Sum(&total, CallOptions::Timeout(absl::Seconds(30)));
  zrpc::examples::Number number;
  constexpr uint64_t kCount = 100;
  for (uint64_t i = 1; i <= kCount; ++i) {
    number.set_value(i);
    REQUIRE(more.Write(number));
  }
  CHECK(more.WritesDone());
  CHECK(more.Finish().ok());
  CHECK(total.count() == kCount);
  CHECK(total.sum() == kCount * (kCount + 1) / 2);
}

namespace {

// A second channel to `served`'s server: its callbacks run on a runtime thread that is outside
// the first channel's connection's domain.
std::unique_ptr<zrpc::ClientChannel> OtherChannel(const Served& served,
                                                  zrpc::ChannelOptions options = {}) {
  options.device = FakeDevice();
  auto channel =
      zrpc::CreateChannel(zrpc::testing::TargetOf(FakeDevice(), served.server->port()), options);
  INFO(channel.status());
  REQUIRE(channel.ok());
  return std::move(*channel);
}

}  // namespace

// A stream destroyed on a runtime thread cancels its call and waits for its end, so the cancel
// must take effect in the stream's domain before the destructor returns. Here the destructor runs
// in a callback of the channel's other connection, on the one poller both share, while an
// application thread holds the stream's domain (held at its post by the stand-in's hook). A
// cancel left in the domain would be handed to that poller when the application thread lets go:
// the very thread waiting for it, stalled for good. It waits for the holder instead.
TEST_CASE(
    "a stream destroyed in a callback on its connection's poller, while an application thread "
    "holds its domain, ends once that thread lets go",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc_test::TestNumbers numbers;
  zrpc::ChannelOptions options;
  options.connections = 2;
  options.pollers = 1;
  options.keepalive_interval = absl::ZeroDuration();
  Served served(FakeDevice(), {&greeter, &numbers}, {}, options);
  REQUIRE(served.channel->Connect(absl::Now() + absl::Seconds(30)).ok());
  Greeter::Stub greeter_stub(served.channel.get());
  zrpc::examples::Numbers::Stub numbers_stub(served.channel.get());
  // Calls take the connections in turn: the stream one (X), the callback's call the other (Y),
  // the holder's call X again.
  auto reader =
      std::make_unique<zrpc::AsyncClientReader<zrpc::examples::Number>>(numbers_stub.AsyncCount(
          zrpc_test::Counting(1'000'000), CallOptions::Timeout(absl::Seconds(30))));
  zrpc::examples::Number number;
  absl::Notification first;
  reader->Read(&number, [&](bool) { first.Notify(); });
  REQUIRE(first.WaitForNotificationWithTimeout(absl::Seconds(30)));  // the stream flows
  // The server fills the stream's window and stops. Until then the poller may handle X's
  // completions in the batch that runs the callback below, holding X's domain too, and the
  // holder's start would be left there instead of holding it.
  absl::SleepFor(absl::Milliseconds(200));

  absl::Notification holding, let_go, destroyed;
  google::protobuf::Empty request, reply, held_reply;
  greeter_stub.AsyncPing(request, &reply, CallOptions::Timeout(absl::Seconds(30)),
                         [&](absl::Status) {
                           holding.WaitForNotificationWithTimeout(absl::Seconds(30));
                           reader.reset();  // cancels, and waits for the call's end
                           destroyed.Notify();
                         });
  std::atomic<std::thread::id> holder_id{};
  const std::function<void()> hook = [&] {
    if (std::this_thread::get_id() != holder_id.load()) return;
    holding.Notify();
    let_go.WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  zrpc::fakeverbs::SetPostSendHook(&hook);
  absl::Status held_status = absl::UnknownError("not ended");
  absl::Notification held_ended;
  std::thread holder([&] {
    holder_id = std::this_thread::get_id();
    greeter_stub.AsyncPing(request, &held_reply, CallOptions::Timeout(absl::Seconds(30)),
                           [&](absl::Status s) {
                             held_status = std::move(s);
                             held_ended.Notify();
                           });
  });
  REQUIRE(holding.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(100));  // the callback reaches the destructor, and waits
  CHECK_FALSE(destroyed.HasBeenNotified());
  let_go.Notify();
  holder.join();
  zrpc::fakeverbs::SetPostSendHook(nullptr);
  if (!destroyed.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    // The poller waits for itself: teardown would hang, so say so and stop here.
    std::fprintf(stderr, "FAILED: the stream's destructor stalled the poller it ran on\n");
    std::abort();
  }
  REQUIRE(held_ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(held_status.ok());
  CHECK(zrpc::testing::Eventually([&] { return served.server->stats().streams_open == 0; }));
  CHECK(zrpc::testing::Eventually([&] { return served.channel->stats().calls_in_flight == 0; }));
}

// A server holding every call (HoldingGreeter) behind a window of three credits, and a client
// (one connection, four send slots) whose slots are all taken by calls waiting for those
// credits: a call a runtime thread starts now finds no slot and waits in the connection's queue.
// `filler`, an application thread, went on starting kFill calls (it may wait for a slot). Drain()
// releases the held calls until `done` holds and the filler's calls have all ended.
struct FullWindow {
  static constexpr int kDataWindow = 3;  // four credits; the last is kept for credit frames
  static constexpr int kSlots = 4;       // the client's send slots
  static constexpr int kFill = 12;

  static zrpc::ServerOptions ServerOptions() {
    zrpc::ServerOptions options;
    options.listener.connection.recv_credits = 4;
    // Receives of its own, so that the window is the four credits from the start: with the
    // shared queue (a server's default) it starts at the floor of three and grows only on demand.
    options.shared_receive_queue = 0;
    return options;
  }
  static zrpc::ChannelOptions ChannelOptions() {
    zrpc::ChannelOptions options = OneConnection();
    options.connection.max_send_slots = kSlots;
    options.keepalive_interval = absl::ZeroDuration();
    return options;
  }

  FullWindow()
      : served(FakeDevice(), {&greeter}, ServerOptions(), ChannelOptions()),
        other(OtherChannel(served)),
        stub(served.channel.get()),
        other_stub(other.get()),
        fill_requests(kFill),
        fill_replies(kFill) {
    filler = std::thread([this] {
      for (int i = 0; i < kFill; ++i) {
        fill_requests[i].set_name(absl::StrCat("fill ", i));
        stub.AsyncSayHello(fill_requests[i], &fill_replies[i],
                           CallOptions::Timeout(absl::Seconds(60)), [this](absl::Status s) {
                             if (s.ok()) ++fill_ok;
                             ++fill_ended;
                           });
        ++fill_started;
      }
    });
    // Three requests sent and held, the next four in the four send slots waiting for credits (a
    // call started by an application thread returns once it has a slot, and those four had
    // theirs only after the first three's sends completed); the filler blocks on a slot. Waiting
    // for that state, not for a time: after a fixed 200 ms a loaded machine (ASan, the whole
    // suite at once) had left two slots free, and two of a test's requests took them instead of
    // the queue.
    REQUIRE(zrpc::testing::Eventually([&] {
      return greeter.held() == kDataWindow && fill_started.load() >= kDataWindow + kSlots;
    }));
    REQUIRE(greeter.held() < kFill);
  }
  ~FullWindow() {
    if (filler.joinable()) Drain([] { return true; });
  }
  template <typename Done>
  void Drain(Done done) {
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while ((!done() || fill_ended.load() != kFill) && absl::Now() < until) {
      greeter.Release();
      absl::SleepFor(absl::Milliseconds(5));
    }
    greeter.Release();
    filler.join();
  }

  HoldingGreeter greeter;
  Served served;
  std::unique_ptr<zrpc::ClientChannel> other;
  Greeter::Stub stub;
  Greeter::Stub other_stub;
  std::vector<zrpc::testing::HelloRequest> fill_requests;
  std::vector<HelloReply> fill_replies;
  std::atomic<int> fill_ok{0}, fill_ended{0}, fill_started{0};
  std::thread filler;
};

// A request started on a runtime thread outside its connection's domain, while every send slot
// is taken, waits in the connection's queue (at most kMaxWaitingBytes); past that it is refused
// at once, its payload let go after the thread leaves the domain and its callback run before the
// start returns; those that waited go when slots free, intact.
TEST_CASE(
    "requests started from another channel's callback past the waiting queue's limit are "
    "refused at once, once each; those that waited arrive",
    "[client_domain]") {
  FullWindow w;
  Greeter::Stub& stub = w.stub;
  Served& served = w.served;

  // Requests of 3.5 MiB (under max_message_size): 18 fit in the queue's 64 MiB.
  constexpr size_t kSize = size_t{7} << 19;
  constexpr int kLarge = 22;
  constexpr size_t kWaitLimit = size_t{64} << 20;  // ClientConnection::kMaxWaitingBytes
  const size_t fit = kWaitLimit / (kSize + 16);
  std::vector<zrpc::testing::HelloRequest> requests(kLarge);
  std::vector<HelloReply> replies(kLarge);
  std::vector<absl::Status> statuses(kLarge, absl::UnknownError("not ended"));
  std::vector<std::atomic<int>> ends(kLarge);
  for (int i = 0; i < kLarge; ++i) {
    std::string name(kSize, 'a' + i);
    name[kSize / 2] = '#';  // a misplaced byte shows
    requests[i].set_name(std::move(name));
  }
  std::atomic<int> refused_before_return{-1};
  absl::Notification started;
  google::protobuf::Empty ping, pong;
  w.other_stub.AsyncPing(ping, &pong, CallOptions::Timeout(absl::Seconds(60)), [&](absl::Status) {
    for (int i = 0; i < kLarge; ++i) {
      stub.AsyncSayHello(requests[i], &replies[i], CallOptions::Timeout(absl::Seconds(60)),
                         [&, i](absl::Status s) {
                           statuses[i] = std::move(s);
                           ++ends[i];
                         });
    }
    int refused = 0;
    for (int i = 0; i < kLarge; ++i) refused += ends[i].load() > 0 ? 1 : 0;
    refused_before_return = refused;
    started.Notify();
  });
  REQUIRE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(refused_before_return.load() == kLarge - static_cast<int>(fit));
  CHECK(served.channel->stats().calls_waited_for_slot == fit);
  auto all_ended = [&] {
    for (int i = 0; i < kLarge; ++i) {
      if (ends[i].load() == 0) return false;
    }
    return true;
  };
  w.Drain(all_ended);
  REQUIRE(all_ended());
  REQUIRE(w.fill_ended.load() == FullWindow::kFill);
  absl::SleepFor(absl::Milliseconds(50));  // nothing ends twice
  CHECK(w.fill_ok.load() == FullWindow::kFill);
  for (int i = 0; i < kLarge; ++i) {
    INFO("request " << i << ": " << statuses[i]);
    CHECK(ends[i].load() == 1);
    if (i < static_cast<int>(fit)) {
      CHECK(statuses[i].ok());
      CHECK(replies[i].message() == "Hello, " + requests[i].name());
    } else {
      CHECK(statuses[i].code() == absl::StatusCode::kResourceExhausted);
      CHECK(absl::StrContains(statuses[i].message(), "waits for a send slot"));
    }
  }
  CHECK(zrpc::testing::Eventually([&] { return served.channel->stats().calls_in_flight == 0; }));
}

// Requests with metadata started on a runtime thread while every send slot is taken wait in the
// connection's queue with their metadata block in front of them: a small one in its slot, and
// one larger than a slot, whose body goes in a payload while its block stays in the SEND. Both
// arrive intact, their metadata with them.
TEST_CASE("requests with metadata that wait for a send slot on a runtime thread keep it",
          "[client_domain]") {
  FullWindow w;
  // From the other channel's callback (a runtime thread): a small request and one past a slot.
  constexpr int kCalls = 2;
  std::vector<zrpc::testing::HelloRequest> requests(kCalls);
  requests[0].set_name("small");
  requests[1].set_name(std::string(20000, 'L'));
  std::vector<HelloReply> replies(kCalls);
  std::vector<zrpc::Metadata> trailers(kCalls);
  std::vector<absl::Status> statuses(kCalls, absl::UnknownError("not ended"));
  std::atomic<int> ended{0};
  zrpc::Metadata sent;
  REQUIRE(sent.Add("tenant", "blue").ok());
  REQUIRE(sent.Add("token-bin", std::string(1500, '\xee')).ok());
  absl::Notification started;
  google::protobuf::Empty ping, pong;
  const uint64_t waited_before = w.served.channel->stats().calls_waited_for_slot;
  w.other_stub.AsyncPing(ping, &pong, CallOptions::Timeout(absl::Seconds(60)), [&](absl::Status) {
    for (int i = 0; i < kCalls; ++i) {
      CallOptions call_options = CallOptions::Timeout(absl::Seconds(60));
      call_options.metadata = sent;
      call_options.trailing_metadata = &trailers[i];
      w.stub.AsyncSayHello(requests[i], &replies[i], call_options, [&, i](absl::Status s) {
        statuses[i] = std::move(s);
        ++ended;
      });
    }
    started.Notify();
  });
  REQUIRE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(w.served.channel->stats().calls_waited_for_slot == waited_before + kCalls);
  w.Drain([&] { return ended.load() == kCalls; });
  REQUIRE(ended.load() == kCalls);
  CHECK(w.fill_ok.load() == FullWindow::kFill);
  for (int i = 0; i < kCalls; ++i) {
    INFO("request " << i << ": " << statuses[i]);
    REQUIRE(statuses[i].ok());
    CHECK(replies[i].message() == "Hello, " + requests[i].name());
    REQUIRE(trailers[i].size() == 2);
    CHECK(*trailers[i].Find("echo-tenant") == "blue");
    CHECK(*trailers[i].Find("echo-token-bin") == std::string(1500, '\xee'));
  }
  CHECK(w.served.server->stats().protocol_violations == 0);
}

// An asynchronous stream opened on a runtime thread while the connection's domain is held: its
// opening is left in the domain, and its half-close, which needs no credit, finds it not gone
// yet. A runtime thread does not wait: the pump tries again when it hears of the opening.
TEST_CASE(
    "an asynchronous stream opened from a callback while its domain is held half-closes after "
    "its opening goes, and finishes",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc_test::TestNumbers numbers;
  Served served(FakeDevice(), {&greeter, &numbers}, {}, OneConnection());
  std::unique_ptr<zrpc::ClientChannel> other = OtherChannel(served);
  Greeter::Stub greeter_stub(served.channel.get());
  Greeter::Stub other_stub(other.get());
  zrpc::examples::Numbers::Stub numbers_stub(served.channel.get());
  google::protobuf::Empty request, reply;
  REQUIRE(greeter_stub.Ping(request, &reply, CallOptions::Timeout(absl::Seconds(30))).ok());
  HeldCallback held;
  held.Start(greeter_stub);
  zrpc::examples::Total total;
  std::unique_ptr<zrpc::AsyncClientWriter<zrpc::examples::Number>> writer;
  absl::Notification opened, finished;
  absl::Status status = absl::UnknownError("not finished");
  other_stub.AsyncPing(request, &reply, CallOptions::Timeout(absl::Seconds(30)), [&](absl::Status) {
    writer = std::make_unique<zrpc::AsyncClientWriter<zrpc::examples::Number>>(
        numbers_stub.AsyncSum(&total, CallOptions::Timeout(absl::Seconds(30))));
    writer->WritesDone();
    writer->Finish([&](absl::Status s) {
      status = std::move(s);
      finished.Notify();
    });
    opened.Notify();
  });
  REQUIRE(opened.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(finished.HasBeenNotified());  // its opening has not gone: the domain is held
  held.go.Notify();
  REQUIRE(held.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  REQUIRE(finished.WaitForNotificationWithTimeout(absl::Seconds(30)));
  INFO(status);
  CHECK(status.ok());
  CHECK(total.count() == 0);
  writer.reset();
  CHECK(zrpc::testing::Eventually([&] { return served.server->stats().streams_open == 0; }));
}

// The channel's timer serves every connection: waiting for one connection's domain, which a
// user's callback on its poller holds for as long as it runs, it would hold up every deadline
// and keepalive of the channel. A keepalive pass over a connection whose domain is held does not
// wait (it asks the NIC instead): the deadline of a call on another connection still fires.
TEST_CASE(
    "a callback that holds its poller does not hold up the channel's timer: a call on another "
    "connection still ends at its deadline",
    "[client_domain]") {
  HoldingGreeter greeter;
  zrpc::ChannelOptions options;
  options.connections = 2;
  options.pollers = 2;  // the other connection's poller is free
  options.keepalive_interval = absl::Milliseconds(20);
  options.idle_keepalive_interval = absl::Milliseconds(20);  // X is idle: checked all the same
  options.keepalive_timeout = absl::Seconds(10);
  Served served(FakeDevice(), {&greeter}, {}, options);
  REQUIRE(served.channel->Connect(absl::Now() + absl::Seconds(30)).ok());
  Greeter::Stub stub(served.channel.get());
  HeldCallback held;
  held.Start(stub);  // connection X: its poller runs the callback, holding X's domain
  // Keepalive passes find X idle (its last message was the callback's answer) and look at it.
  absl::SleepFor(absl::Milliseconds(100));
  // The next call goes to the other connection, Y; the server holds it, so only its deadline
  // can end it, and deadlines are the timer's.
  HelloReply reply;
  absl::Notification ended;
  absl::Status status;
  const absl::Time start = absl::Now();
  absl::Time end;
  stub.AsyncSayHello(Named("held"), &reply, CallOptions::Timeout(absl::Milliseconds(200)),
                     [&](absl::Status s) {
                       status = std::move(s);
                       end = absl::Now();
                       ended.Notify();
                     });
  const bool in_time = ended.WaitForNotificationWithTimeout(absl::Seconds(10));
  held.go.Notify();  // in any case: the teardown needs the poller back
  REQUIRE(held.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  REQUIRE(ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  INFO("the call ended after " << (end - start) << ": " << status);
  CHECK(in_time);
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(held.status.ok());
  CHECK(served.channel->stats().connections_lost == 0);
  greeter.Release();
}

namespace {

// Reads a stream from its callbacks, on the client's poller: each read owes the server a credit
// (a frame every stream_window / 2), sent from there.
struct PollerReadLoop {
  zrpc::AsyncClientReader<zrpc::examples::Number>* reader = nullptr;
  zrpc::examples::Number number;
  std::atomic<uint64_t> count{0};
  absl::Notification ended;

  void Start() {
    reader->Read(&number, [this](bool ok) {
      if (!ok) return ended.Notify();
      count.fetch_add(1);
      Start();
    });
  }
};

}  // namespace

// A frame that an asynchronous stream's pump sends from a runtime thread does not wait there for
// a send slot: it waits to be told that one came back. Before, only the channel's timer told it
// (every millisecond); now the send completion that frees a slot does, and the timer is the
// fallback. Here the timer waits an hour, so the stream finishes only if the completions tell.
TEST_CASE(
    "credits a read loop owes on its poller while every send slot is taken go when a send "
    "completes frees one, not on a timer",
    "[client_domain]") {
  const zrpc_test::NoTimedSlotRetry no_timer;
  zrpc_test::TestNumbers numbers;
  absl::Notification gate;
  numbers.square_gate = &gate;
  // The Square calls' replies and count: they outlive the channel, which ends the calls.
  constexpr int kCalls = 60;
  std::vector<zrpc::examples::Number> replies(kCalls);
  std::atomic<int> answered{0};
  zrpc::ChannelOptions options = OneConnection();
  options.connection.max_send_slots = 8;
  // The timer would pass for keepalives too, and each pass tells what waits for a slot.
  options.keepalive_interval = absl::ZeroDuration();
  Served served(FakeDevice(), {&numbers}, {}, options);
  zrpc::examples::Numbers::Stub stub(served.channel.get());
  zrpc::examples::CountRequest trickle = zrpc_test::Counting(100);
  trickle.set_delay_us(10'000);
  PollerReadLoop loop;  // outlives the reader, whose destruction stops its callbacks
  zrpc::AsyncClientReader<zrpc::examples::Number> reader =
      stub.AsyncCount(trickle, CallOptions::Timeout(absl::Seconds(60)));
  std::thread caller;
  // However the test ends, the held calls go and the caller is joined before the rest goes.
  struct Release {
    absl::Notification& gate;
    std::thread& caller;
    ~Release() {
      if (!gate.HasBeenNotified()) gate.Notify();
      if (caller.joinable()) caller.join();
    }
  } release{gate, caller};
  loop.reader = &reader;
  loop.Start();
  REQUIRE(zrpc::testing::Eventually([&] { return loop.count.load() > 0; }));

  // The server holds its Square calls (and with them its receive credits): the next requests
  // wait for credits in the client's send slots until all 8 are taken, and the caller is stuck.
  caller = std::thread([&] {
    zrpc::examples::Number request;
    request.set_value(3);
    for (zrpc::examples::Number& reply : replies) {
      stub.AsyncSquare(request, &reply, CallOptions::Timeout(absl::Seconds(60)),
                       [&](absl::Status status) { answered.fetch_add(status.ok() ? 1 : 0); });
    }
  });
  const uint64_t in_flight = zrpc_test::WaitUntilStuck(
      [&] { return served.channel->stats().calls_in_flight; }, 8, absl::Seconds(30));
  INFO("calls in flight: " << in_flight);  // above the 8 slots' worth: the caller is stuck
  CHECK(in_flight < 1 + kCalls);           // the stream, and calls the caller could not start
  // The server stops at its window once the credits owed meanwhile (no slot for them) do not go.
  const uint64_t stalled =
      zrpc_test::WaitUntilStuck([&] { return loop.count.load(); }, 0, absl::Seconds(30));
  CHECK(stalled < 100);
  CHECK_FALSE(loop.ended.HasBeenNotified());

  gate.Notify();
  caller.join();
  CHECK(zrpc::testing::Eventually([&] { return answered.load() == kCalls; }));
  REQUIRE(loop.ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(loop.count.load() == 100);
  absl::Notification finished;
  absl::Status status = absl::UnknownError("not finished");
  reader.Finish([&](absl::Status s) {
    status = std::move(s);
    finished.Notify();
  });
  REQUIRE(finished.WaitForNotificationWithTimeout(absl::Seconds(30)));
  INFO(status);
  CHECK(status.ok());
}
