// A device without shared receive queues or type-2 memory windows (fakeverbs' Capabilities, on
// the host): a server and channels at default options fall back, each said once a process, to
// receives and arenas per connection and to a registration per pulled payload, and serve as
// before. One test case: the sayings are once a process, and the device is the process's.
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/fakeverbs/fake_verbs.h"
#include "tests/log_capture.h"
#include "tests/pattern.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::OutgoingBulk;
using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::fakeverbs::FakeDevice;
using zrpc::testing::Filled;
using zrpc::testing::Key;
using zrpc::testing::kLong;
using zrpc::testing::Served;
using zrpc::testing::TestGreeter;
using zrpc::testing::Within;

constexpr size_t kObject = 1 << 20;  // past the 256 KiB arenas: pulled

// Get answers kObject patterned bytes, never registered: each answer is exposed for pulling.
class Objects : public zrpc::testing::KeepingStore {
 public:
  absl::Status Get(zrpc::ServerContext&, const ObjectKey&, ObjectInfo* info,
                   OutgoingBulk* bulk) override {
    *bulk = OutgoingBulk(bytes.data(), bytes.size(), [] {});
    info->set_size(bytes.size());
    return absl::OkStatus();
  }
  const std::string bytes = Filled(kObject, 9);
};

// A hello of `name_size` bytes, answered whole: over a slot (4 KiB) it travels in an arena.
void Hello(zrpc::Channel* channel, size_t name_size) {
  Greeter::Stub stub(channel);
  HelloRequest request;
  request.set_name(std::string(name_size, 'n'));
  HelloReply reply;
  const absl::Status s = stub.SayHello(request, &reply, Within(kLong));
  INFO(s);
  REQUIRE(s.ok());
  CHECK(reply.message() == "Hello, " + request.name());
}

TEST_CASE(
    "without shared receive queues or memory windows, a server and its channels fall back, say "
    "so once, and serve small, arena and pulled calls",
    "[fallback]") {
  zrpc::fakeverbs::SetCapabilities({/*shared_receive_queues=*/false, /*windows=*/false});
  zrpc::testing::LogCapture log(zrpc::LogLevel::kWarning);
  TestGreeter greeter;
  Objects objects;
  zrpc::ChannelOptions many;
  many.connections = 24;  // more than 16 a poller: a channel that would share its receives
  many.connect_timeout = kLong;
  many.slots.slot_size = 8192;  // not the server's: a device of its own, counted apart
  Served served(FakeDevice(), {&greeter, &objects}, {}, many);
  {
    const zrpc::ServerStats stats = served.server->stats();
    CHECK(stats.parked_windows == 0);
  }
  // Every connection answers, small and through its own arena.
  for (int i = 0; i < many.connections; ++i) {
    Hello(served.channel.get(), 10);
    Hello(served.channel.get(), 16 << 10);
  }
  // Pulled, by a registration each: its key is the registration's.
  ObjectStore::Stub stub(served.channel.get());
  const uint64_t before = served.server->stats().memory_registrations;
  constexpr int kGets = 3;
  for (int i = 0; i < kGets; ++i) {
    ObjectInfo info;
    zrpc::IncomingBulk bulk;
    const absl::Status s = stub.Get(Key("object"), &info, &bulk, Within(kLong));
    INFO(s);
    REQUIRE(s.ok());
    CHECK(zrpc::testing::FirstDifference(bulk.view(), objects.bytes) == "equal");
  }
  CHECK(served.server->stats().memory_registrations - before == kGets);
  // A second channel says nothing new.
  zrpc::ChannelOptions again = many;
  again.device = FakeDevice();
  auto second =
      zrpc::CreateChannel(zrpc::testing::TargetOf(FakeDevice(), served.server->port()), again);
  REQUIRE(second.ok());
  Hello(second->get(), 16 << 10);
  CHECK(served.channel->stats().connections_lost == 0);

  CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc", "has no shared receive queues") == 1);
  CHECK(log.Count(zrpc::LogLevel::kWarning, "rpc", "has no type-2 memory windows") == 1);
  for (const auto& record : log.records()) {
    INFO(record.component << ": " << record.message);
    CHECK(record.level == zrpc::LogLevel::kWarning);
  }
}

}  // namespace
