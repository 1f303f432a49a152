// Teardown at its edges, on a real device (tag "rdma"; run under ASan by tools/test --asan,
// which is what catches a touch of freed memory here): handles that outlive what made them,
// channels destroyed from their own callbacks, calls finished while the server shuts down.
#include <atomic>
#include <catch2/catch.hpp>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

// Before: the payload's record held its transport connection only; the connection's device (its
// slot pool, its protection domain) and its poller's CQ went with the server and channel, and
// the release (or the connection's destruction it triggered) touched them.
TEST_CASE("a response payload released after its channel and the server are destroyed") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  const std::string object = Pattern(64 << 10, 5);
  zrpc::IncomingBulk kept;
  {
    Runtime rt(config);
    ObjectStore::Stub stub(rt.channel.get());
    ObjectKey key;
    key.set_name("kept");
    PutReply put;
    REQUIRE(
        stub.Put(key, zrpc::OutgoingBulk(object.data(), object.size()), &put, Within(kLong)).ok());
    ObjectInfo info;
    REQUIRE(stub.Get(key, &info, &kept, Within(kLong)).ok());
    REQUIRE(kept.size() == object.size());
    rt.channel.reset();
    rt.server->Shutdown(absl::Seconds(1));
  }  // the server, and with it the last other owner of the device, is gone
  CHECK(kept.view() == object);  // still mapped
  kept.Reset();
  // The process is sound: a new server and channel work.
  Runtime again(config);
  Greeter::Stub stub(again.channel.get());
  HelloRequest request;
  request.set_name("again");
  HelloReply reply;
  REQUIRE(stub.SayHello(request, &reply, Within(kLong)).ok());
}

// Keeps the request payload of every Put, released whenever the test says.
class KeepingStore : public ObjectStore::Service {
 public:
  absl::Status Put(zrpc::ServerContext&, const ObjectKey&, zrpc::IncomingBulk bulk,
                   PutReply* reply) override {
    reply->set_stored_bytes(bulk.size());
    absl::MutexLock lock(&mu_);
    kept_.push_back(std::move(bulk));
    return absl::OkStatus();
  }
  absl::Status Get(zrpc::ServerContext&, const ObjectKey&, ObjectInfo*,
                   zrpc::OutgoingBulk*) override {
    return absl::UnimplementedError("Get");
  }
  absl::Status Transform(zrpc::ServerContext&, const ObjectKey&, zrpc::IncomingBulk, ObjectInfo*,
                         zrpc::OutgoingBulk*) override {
    return absl::UnimplementedError("Transform");
  }
  absl::Status Stat(zrpc::ServerContext&, const ObjectKey&, ObjectInfo*) override {
    return absl::UnimplementedError("Stat");
  }
  std::deque<zrpc::IncomingBulk> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(kept_, {});
  }

 private:
  absl::Mutex mu_;
  std::deque<zrpc::IncomingBulk> kept_;
};

TEST_CASE("request payloads a handler kept, released after the server is destroyed") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  KeepingStore store;
  std::deque<zrpc::IncomingBulk> kept;
  const std::string object = Pattern(16 << 10, 9);
  {
    Served served(config, {&store});
    ObjectStore::Stub stub(served.channel.get());
    for (int i = 0; i < 3; ++i) {
      ObjectKey key;
      key.set_name(absl::StrCat("object ", i));
      PutReply put;
      REQUIRE(stub.Put(key, zrpc::OutgoingBulk(object.data(), object.size()), &put, Within(kLong))
                  .ok());
    }
    kept = store.Take();
    served.channel.reset();
  }  // the server is destroyed with three payloads of its connection still held
  REQUIRE(kept.size() == 3);
  for (zrpc::IncomingBulk& bulk : kept) {
    CHECK(bulk.view() == object);
    bulk.Reset();
  }
}

// Before: the destructor joined the thread it ran on (std::thread throws, the process aborts).
TEST_CASE(
    "a channel destroyed from one of its own callbacks: no abort, the other calls end "
    "CANCELLED") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Runtime rt(config);
  auto channel = std::move(rt.channel);
  Greeter::Stub stub(channel.get());
  HelloRequest slow_request;
  slow_request.set_name("sleep:2000");
  HelloReply slow_reply;
  absl::Notification slow_done;
  absl::Status slow_status;
  stub.AsyncSayHello(slow_request, &slow_reply, Within(kLong), [&](absl::Status s) {
    slow_status = std::move(s);
    slow_done.Notify();
  });
  HelloRequest request;
  request.set_name("quick");
  HelloReply reply;
  absl::Notification destroyed;
  absl::Status status;
  stub.AsyncSayHello(request, &reply, Within(kLong), [&](absl::Status s) {
    status = std::move(s);
    channel.reset();  // on the poller thread that runs this callback
    destroyed.Notify();
  });
  REQUIRE(destroyed.WaitForNotificationWithTimeout(kLong));
  CHECK(status.ok());
  REQUIRE(slow_done.WaitForNotificationWithTimeout(kLong));
  INFO(slow_status);
  CHECK(slow_status.code() == absl::StatusCode::kCancelled);
}

// Before: Finish deleted the call, then decremented the server's count of calls and then
// locked the server's mutex to wake Shutdown; a Shutdown that saw the count reach zero could
// return, and the server be destroyed, in between.
TEST_CASE(
    "calls finished from the service's own threads while Shutdown waits for them, then "
    "the server destroyed at once, 10 rounds") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  for (int round = 0; round < 10; ++round) {
    INFO("round " << round);
    HoldingGreeter greeter;
    Served served(config, {&greeter});
    Greeter::Stub stub(served.channel.get());
    constexpr int kCalls = 24;
    std::vector<HelloRequest> requests(kCalls);
    std::vector<HelloReply> replies(kCalls);
    std::atomic<int> ended{0};
    for (int i = 0; i < kCalls; ++i) {
      requests[i].set_name("held");
      stub.AsyncSayHello(requests[i], &replies[i], Within(kLong),
                         [&](absl::Status) { ended.fetch_add(1); });
    }
    const absl::Time until = absl::Now() + kLong;
    while (greeter.held() < kCalls && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
    REQUIRE(greeter.held() == kCalls);
    std::thread finisher([&] {
      absl::SleepFor(absl::Milliseconds(round % 4));  // land at different points of Shutdown
      greeter.Release(4);
    });
    served.server->Shutdown(absl::Seconds(5));
    served.server.reset();  // at once: nothing of the server may be touched after Shutdown
    finisher.join();
    served.channel.reset();
    CHECK(ended.load() == kCalls);
  }
}

}  // namespace
