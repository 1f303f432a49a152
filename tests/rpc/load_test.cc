// The runtime under load, on a real device (tag "rdma"): full windows, slow handlers, callbacks
// that call again. Each case once failed: the comment above it says how.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/rdma_device.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::testing::Greeter;
using zrpc::testing::HelloReply;
using zrpc::testing::HelloRequest;
using zrpc::testing::HoldingGreeter;
using zrpc::testing::kLong;
using zrpc::testing::ObjectInfo;
using zrpc::testing::ObjectKey;
using zrpc::testing::ObjectStore;
using zrpc::testing::Pattern;
using zrpc::testing::PutReply;
using zrpc::testing::Runtime;
using zrpc::testing::Served;
using zrpc::testing::Within;

zrpc::ChannelOptions FastKeepalives() {
  zrpc::ChannelOptions options;
  options.keepalive_interval = absl::Milliseconds(100);
  options.keepalive_timeout = absl::Milliseconds(200);
  return options;
}

// Before: the ping was an ordinary SEND that waited for credits behind the calls the server
// held, went unanswered, and closed the connection after interval + timeout: every call failed
// UNAVAILABLE ("keepalive: no answer from the server within ... credits available 1 of 32").
TEST_CASE(
    "a server holding a window's worth of slow calls for many keepalive timeouts is not "
    "declared dead (blocking handlers)") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.handler_threads = 40;  // enough for every call: the window is the limit
  Runtime rt(config, server_options, FastKeepalives());
  Greeter::Stub stub(rt.channel.get());
  constexpr int kCalls = 36;  // more than the 32 receives a connection gives the server
  zrpc::testing::HelloBatch calls(stub, std::vector<std::string>(kCalls, "sleep:1500"), kLong);
  REQUIRE(calls.Wait(kLong));  // "sleep:1500": 7 keepalive timeouts
  for (int i = 0; i < kCalls; ++i) {
    INFO("call " << i << ": " << calls.status(i));
    CHECK(calls.status(i).ok());
    CHECK(calls.reply(i).message() == "Hello, sleep:1500");
  }
  CHECK(rt.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "a server holding a window's worth of calls for many keepalive timeouts is not "
    "declared dead (AsyncService)") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  HoldingGreeter greeter;
  Served served(config, {&greeter}, {}, FastKeepalives());
  Greeter::Stub stub(served.channel.get());

  constexpr int kCalls = 40;
  std::vector<HelloRequest> requests(kCalls);
  std::vector<HelloReply> replies(kCalls);
  std::vector<absl::Status> statuses(kCalls);
  std::atomic<int> done{0};
  absl::Notification all_done;
  for (int i = 0; i < kCalls; ++i) {
    requests[i].set_name(absl::StrCat("held ", i));
    stub.AsyncSayHello(requests[i], &replies[i], Within(kLong), [&, i](absl::Status s) {
      statuses[i] = std::move(s);
      if (done.fetch_add(1) + 1 == kCalls) all_done.Notify();
    });
  }
  // The server holds as many as the window lets through; the rest wait on this side.
  const absl::Time until = absl::Now() + kLong;
  while (greeter.held() < 30 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(greeter.held() >= 30);
  absl::SleepFor(absl::Milliseconds(1500));  // 7 keepalive timeouts
  CHECK_FALSE(all_done.HasBeenNotified());
  CHECK(served.channel->stats().connections_lost == 0);
  // Answer everything, including the calls that arrive as the window frees.
  while (!all_done.HasBeenNotified() && absl::Now() < until) {
    greeter.Release();
    absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE(all_done.HasBeenNotified());
  for (int i = 0; i < kCalls; ++i) {
    INFO("call " << i << ": " << statuses[i]);
    CHECK(statuses[i].ok());
    CHECK(replies[i].message() == absl::StrCat("Hello, held ", i));
  }
  CHECK(served.channel->stats().connections_lost == 0);
  served.channel.reset();
  served.server->Shutdown(absl::Seconds(1));
}

// Starts SayHello(name) and, from its callback, two more, until `depth` levels: a client that
// pipelines its work from completion callbacks.
struct CallTree {
  CallTree(Greeter::Stub* s, int d, std::string n = "sleep:50",
           absl::Duration t = absl::Seconds(20))
      : stub(s), depth(d), name(std::move(n)), timeout(t) {}
  Greeter::Stub* stub;
  int depth;
  std::string name;
  absl::Duration timeout;
  std::atomic<int> started{0};
  std::atomic<int> ok{0};
  std::atomic<int> deadline_exceeded{0};
  std::atomic<int> other{0};
  absl::Mutex mu;
  std::vector<std::string> unexpected;

  void Start(int level) {
    started.fetch_add(1);
    auto request = std::make_shared<HelloRequest>();
    auto reply = std::make_shared<HelloReply>();
    request->set_name(name);
    stub->AsyncSayHello(*request, reply.get(), Within(timeout),
                        [this, level, request, reply](absl::Status s) {
                          if (s.ok()) {
                            ok.fetch_add(1);
                          } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
                            deadline_exceeded.fetch_add(1);
                          } else {
                            other.fetch_add(1);
                            absl::MutexLock lock(&mu);
                            unexpected.push_back(s.ToString());
                          }
                          if (level + 1 < depth) {
                            Start(level + 1);
                            Start(level + 1);
                          }
                          ended.fetch_add(1);
                        });
  }
  // Waits up to `within` for `calls` to end; true when they did.
  bool WaitFor(int calls, absl::Duration within) {
    const absl::Time until = absl::Now() + within;
    while (ended.load() < calls && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
    return ended.load() == calls;
  }
  std::atomic<int> ended{0};
};

// Before (1): AcquireSendSlot waited for a slot until the call's deadline, on the poller thread
// the callback ran on, which is the only thread that frees slots: the poller (and every
// connection on it) stopped until the deadline, forever with none. Before (2): such a call
// failed at once with RESOURCE_EXHAUSTED ("runtime thread"): 66 of 124 calls of a tree like
// this one. Now it waits in its connection's queue and goes when a slot frees.
TEST_CASE(
    "callbacks that each start two more calls with 4 send slots: every call is sent and "
    "answered, and the poller is never blocked") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.listener.connection.recv_credits = 4;  // two requests in flight, the rest wait
  zrpc::ChannelOptions channel_options;
  channel_options.connection.max_send_slots = 4;  // ... holding a slot each, four at most
  Runtime rt(config, server_options, channel_options);
  Greeter::Stub stub(rt.channel.get());
  const int depth = GENERATE(5, 7);
  const int calls = (1 << depth) - 1;  // 31 or 127
  CallTree tree(&stub, depth, depth == 5 ? "sleep:50" : "quick");
  tree.Start(0);
  // Deadlines are 20 s: a poller blocked until them would miss this by far.
  const bool all_ended = tree.WaitFor(calls, absl::Seconds(15));
  INFO("depth " << depth << ": ok " << tree.ok.load() << ", deadline "
                << tree.deadline_exceeded.load() << ", other " << tree.other.load());
  REQUIRE(all_ended);
  CHECK(tree.started.load() == calls);
  for (const std::string& s : tree.unexpected) FAIL_CHECK(s);
  CHECK(tree.ok.load() == calls);
  CHECK(rt.channel->stats().calls_waited_for_slot > 0);  // the case under test did happen
  // The poller is free: an ordinary blocking call goes through.
  HelloRequest request;
  request.set_name("after");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply, Within(kLong)).ok());
}

// A call waiting in the connection's queue is a call like any other: its deadline ends it there
// (DEADLINE_EXCEEDED, once), it is never sent after, and the queue behind it moves on.
TEST_CASE(
    "calls started from callbacks that wait for a send slot past their deadline end with "
    "DEADLINE_EXCEEDED, once each, and the connection serves the next calls") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.listener.connection.recv_credits = 4;
  zrpc::ChannelOptions channel_options;
  channel_options.connection.max_send_slots = 4;
  Runtime rt(config, server_options, channel_options);
  Greeter::Stub stub(rt.channel.get());
  // Every call sleeps 300 ms in its handler, with 200 ms to live: two run at a time, so the
  // calls behind them (waiting for credits, then for slots) see their deadline pass.
  CallTree tree(&stub, 4, "sleep:300", absl::Milliseconds(200));
  tree.Start(0);
  constexpr int kCalls = 15;
  const bool all_ended = tree.WaitFor(kCalls, absl::Seconds(15));
  INFO("ok " << tree.ok.load() << ", deadline " << tree.deadline_exceeded.load() << ", other "
             << tree.other.load());
  REQUIRE(all_ended);
  for (const std::string& s : tree.unexpected) FAIL_CHECK(s);
  CHECK(tree.ok.load() + tree.deadline_exceeded.load() == kCalls);
  CHECK(tree.deadline_exceeded.load() > 0);  // the case under test did happen
  CHECK(rt.channel->stats().calls_waited_for_slot > 0);
  absl::SleepFor(absl::Milliseconds(100));  // nothing ends twice
  CHECK(tree.ended.load() == kCalls);
  HelloRequest request;
  request.set_name("after");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply, Within(kLong)).ok());
  CHECK(reply.message() == "Hello, after");
}

// A request larger than a slot, and larger than the server's receive arena, started from a
// callback while every send slot is taken: it waits in memory of its own, then goes as a payload
// the server pulls (rpc/WIRE.md), intact. From the moment it waits, its body is a payload behind
// the call's gate, as Start's is: the call's `done` waits until the server has pulled it.
TEST_CASE(
    "a request larger than the server's arena, started from a callback while every send slot "
    "is taken, waits, then arrives intact") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  HoldingGreeter greeter;
  zrpc::ServerOptions server_options;
  server_options.listener.connection.recv_credits = 4;
  zrpc::ChannelOptions channel_options;
  channel_options.connection.max_send_slots = 4;
  Served served(config, {&greeter}, server_options, channel_options);
  Greeter::Stub stub(served.channel.get());
  // The server holds what its window lets through; the calls behind them wait for its credits,
  // one in each send slot, and the filler's next call waits for a slot (an application thread
  // may wait).
  constexpr int kFill = 12;
  std::vector<HelloRequest> fill_requests(kFill);
  std::vector<HelloReply> fill_replies(kFill);
  std::atomic<int> fill_ok{0}, fill_ended{0};
  std::thread filler([&] {
    for (int i = 0; i < kFill; ++i) {
      fill_requests[i].set_name(absl::StrCat("fill ", i));
      stub.AsyncSayHello(fill_requests[i], &fill_replies[i], Within(kLong), [&](absl::Status s) {
        if (s.ok()) fill_ok.fetch_add(1);
        fill_ended.fetch_add(1);
      });
    }
  });
  const absl::Time until = absl::Now() + kLong;
  while (greeter.held() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(300));  // the window fills; the filler blocks on a slot
  REQUIRE(greeter.held() < kFill);          // some wait on this side
  // A callback on another channel's poller (a runtime thread) starts the large call.
  Runtime other(config);
  Greeter::Stub other_stub(other.channel.get());
  HelloRequest trigger;
  trigger.set_name("trigger");
  HelloReply trigger_reply;
  // ASCII (a string field must be UTF-8), varied so that a misplaced byte shows.
  std::string big(300 << 10, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + (i * 7 + i / 26) % 26);
  HelloRequest large;
  large.set_name(big);
  HelloReply large_reply;
  absl::Status large_status = absl::UnknownError("not ended");
  absl::Notification large_done;
  absl::Status trigger_status;
  absl::Notification started;
  other_stub.AsyncSayHello(trigger, &trigger_reply, Within(kLong), [&](absl::Status s) {
    trigger_status = std::move(s);
    stub.AsyncSayHello(large, &large_reply, Within(kLong), [&](absl::Status status) {
      large_status = std::move(status);
      large_done.Notify();
    });
    started.Notify();
  });
  // Nothing is released before the large call has started: it finds every slot taken.
  REQUIRE(started.WaitForNotificationWithTimeout(kLong));
  REQUIRE(trigger_status.ok());
  CHECK(served.channel->stats().calls_waited_for_slot == 1);
  // Answer everything, including what arrives as the window frees.
  while (!(large_done.HasBeenNotified() && fill_ended.load() == kFill) && absl::Now() < until) {
    greeter.Release();
    absl::SleepFor(absl::Milliseconds(5));
  }
  filler.join();
  REQUIRE(large_done.HasBeenNotified());
  INFO(large_status);
  CHECK(large_status.ok());
  CHECK(large_reply.message() == "Hello, " + big);
  CHECK(fill_ok.load() == kFill);
}

// Before: a call whose deadline passed while it waited for a handler thread still ran its
// handler, and an answer finished after the deadline was still staged and sent (to be dropped by
// the client as late).
TEST_CASE(
    "calls given up while queued never run their handler; answers nobody waits for are "
    "not sent") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.handler_threads = 1;
  // Every queued call must reach the server at once, within its 50 ms: a window of the
  // connection's own receives (32), not a shared queue's floor of 3 that grows with use.
  server_options.shared_receive_queue = 0;
  server_options.max_pollers = 0;
  Runtime rt(config, server_options);
  Greeter::Stub stub(rt.channel.get());
  HelloRequest warm;
  warm.set_name("warm");
  HelloReply warm_reply;
  REQUIRE(stub.SayHello(warm, &warm_reply, Within(kLong)).ok());
  REQUIRE(rt.greeter.hellos.load() == 1);

  constexpr int kQueued = 10;
  std::vector<HelloRequest> requests(kQueued + 1);
  std::vector<HelloReply> replies(kQueued + 1);
  std::vector<absl::Status> statuses(kQueued + 1);
  std::atomic<int> ended{0};
  // The slow one takes the only thread for 300 ms, past its own 100 ms deadline.
  requests[0].set_name("sleep:300");
  stub.AsyncSayHello(requests[0], &replies[0], Within(absl::Milliseconds(100)),
                     [&](absl::Status s) {
                       statuses[0] = std::move(s);
                       ended.fetch_add(1);
                     });
  absl::SleepFor(absl::Milliseconds(20));  // it is running
  for (int i = 1; i <= kQueued; ++i) {
    requests[i].set_name(absl::StrCat("queued ", i));
    stub.AsyncSayHello(requests[i], &replies[i], Within(absl::Milliseconds(50)),
                       [&, i](absl::Status s) {
                         statuses[i] = std::move(s);
                         ended.fetch_add(1);
                       });
  }
  const absl::Time until = absl::Now() + kLong;
  while (ended.load() < kQueued + 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  REQUIRE(ended.load() == kQueued + 1);
  for (int i = 0; i <= kQueued; ++i) {
    INFO("call " << i << ": " << statuses[i]);
    CHECK(statuses[i].code() == absl::StatusCode::kDeadlineExceeded);
  }
  // Let the server get through its queue, then count.
  while ((rt.server->stats().calls_skipped < kQueued || rt.server->stats().answers_dropped < 1) &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK(rt.greeter.hellos.load() == 2);  // the warm-up and the slow one; none of the queued
  CHECK(rt.server->stats().calls_skipped == kQueued);
  CHECK(rt.server->stats().answers_dropped == 1);  // the slow one's
  CHECK(rt.channel->stats().late_responses == 0);  // nothing was sent to be dropped
  REQUIRE(stub.SayHello(warm, &warm_reply, Within(kLong)).ok());
}

// Before: one FIFO for the whole pool, so a call from a second client waited behind every call
// the first had queued: 30 x 30 ms here.
TEST_CASE(
    "a client flooding a one-thread server does not hold another client's calls behind "
    "its flood") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::ServerOptions server_options;
  server_options.handler_threads = 1;
  Runtime rt(config, server_options);
  zrpc::ChannelOptions other_options;
  other_options.device = config;
  auto other = zrpc::CreateChannel(rt.target(), other_options);
  REQUIRE(other.ok());
  Greeter::Stub flooder(rt.channel.get());
  Greeter::Stub polite(other->get());
  HelloRequest request;
  request.set_name("hi");
  HelloReply reply;
  REQUIRE(polite.SayHello(request, &reply, Within(kLong)).ok());  // connected

  constexpr int kFlood = 30;
  constexpr int kHandlerMs = 30;
  std::vector<HelloRequest> requests(kFlood);
  std::vector<HelloReply> replies(kFlood);
  std::atomic<int> flood_ok{0};
  std::atomic<int> flood_ended{0};
  for (int i = 0; i < kFlood; ++i) {
    requests[i].set_name(absl::StrCat("sleep:", kHandlerMs));
    flooder.AsyncSayHello(requests[i], &replies[i], Within(kLong), [&](absl::Status s) {
      if (s.ok()) flood_ok.fetch_add(1);
      flood_ended.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(3 * kHandlerMs));  // the flood is queued and running
  absl::Duration worst;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    REQUIRE(polite.SayHello(request, &reply, Within(kLong)).ok());
    worst = std::max(worst, absl::Now() - start);
  }
  INFO("worst polite call " << worst << "; the flood alone takes " << kFlood * kHandlerMs << " ms");
  // Round robin: each polite call waits for about one flood call. In one FIFO it would wait
  // for what is left of the flood, most of 900 ms.
  CHECK(worst < absl::Milliseconds(kFlood * kHandlerMs / 2));
  const absl::Time until = absl::Now() + kLong;
  while (flood_ended.load() < kFlood && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  CHECK(flood_ok.load() == kFlood);
}

// Before: response payloads were staged into the server-wide pool as soon as each handler
// finished and held until their WRITE completed, which waits for the client's arena. A client
// holding one received payload while asking for more pinned staging until every other client's
// bulk answer failed RESOURCE_EXHAUSTED.
TEST_CASE(
    "a client that holds its received payloads and keeps asking for more does not starve "
    "other clients of staging") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr size_t kPayload = 64 << 10;
  zrpc::ServerOptions server_options;
  server_options.staging_bytes = 4 * kPayload;  // four payloads' worth for everyone
  Runtime rt(config, server_options);
  zrpc::ChannelOptions hoarder_options;
  hoarder_options.device = config;
  hoarder_options.connection.arena_size = kPayload;  // one payload fills it
  auto hoarder_channel = zrpc::CreateChannel(rt.target(), hoarder_options);
  REQUIRE(hoarder_channel.ok());
  ObjectStore::Stub hoarder(hoarder_channel->get());
  ObjectStore::Stub other(rt.channel.get());

  const std::string object = Pattern(kPayload, 21);
  ObjectKey key;
  key.set_name("shared");
  PutReply put;
  REQUIRE(
      other.Put(key, zrpc::OutgoingBulk(object.data(), object.size()), &put, Within(kLong)).ok());
  ObjectInfo held_info;
  zrpc::IncomingBulk held;
  REQUIRE(hoarder.Get(key, &held_info, &held, Within(kLong)).ok());  // its arena is now full

  // Six more Gets: their answers can only land once `held` is released.
  constexpr int kAsks = 6;
  std::vector<ObjectInfo> infos(kAsks);
  std::vector<zrpc::IncomingBulk> payloads(kAsks);
  std::vector<absl::Status> statuses(kAsks);
  std::atomic<int> answered{0};
  for (int i = 0; i < kAsks; ++i) {
    hoarder.AsyncGet(key, &infos[i], &payloads[i], Within(kLong), [&, i](absl::Status s) {
      statuses[i] = std::move(s);
      if (statuses[i].ok() && payloads[i].view() != object) {
        statuses[i] = absl::DataLossError("payload differs");
      }
      payloads[i].Reset();  // lets the next answer land
      answered.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(200));  // the server has answered them all by now
  CHECK(answered.load() == 0);
  for (int i = 0; i < 5; ++i) {
    ObjectInfo info;
    zrpc::IncomingBulk payload;
    absl::Status s = other.Get(key, &info, &payload, Within(kLong));
    INFO("other client's Get " << i << ": " << s);
    REQUIRE(s.ok());
    CHECK(payload.view() == object);
  }
  held.Reset();
  const absl::Time until = absl::Now() + kLong;
  while (answered.load() < kAsks && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(answered.load() == kAsks);
  for (int i = 0; i < kAsks; ++i) {
    INFO("hoarder's Get " << i << ": " << statuses[i]);
    CHECK(statuses[i].ok());
  }
  hoarder_channel->reset();
}

// Before: a payload written into a large arena took longer than the keepalive timeout to move
// (64 MiB, about 2 s under emulation); the ping queued behind the WRITE went unanswered and
// closed the connection ("keepalive: no answer from the server within 2s (... in flight 3,
// arena in use 67108864 (peer))"): tools/bench's 64 MiB put failed that way.
TEST_CASE("a payload still being written when pings fall due is not taken for a dead server") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::testing::KeepingStore store;
  zrpc::ServerOptions server_options;
  server_options.listener.connection.arena_size = 64 << 20;  // written, not pulled
  zrpc::ChannelOptions channel_options = FastKeepalives();
  channel_options.staging_bytes = 128 << 20;
  Served served(config, {&store}, server_options, channel_options);
  ObjectStore::Stub stub(served.channel.get());
  const std::string object(64 << 20, 'w');
  PutReply put;
  absl::Status s = stub.Put(zrpc::testing::Key("big"),
                            zrpc::OutgoingBulk(object.data(), object.size()), &put, Within(kLong));
  INFO(s);
  CHECK(s.ok());
  CHECK(put.stored_bytes() == object.size());
  CHECK(served.channel->stats().connections_lost == 0);
}

}  // namespace
