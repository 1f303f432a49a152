// Retries of unary calls to idempotent methods (ChannelOptions::retry; rpc/channel.h,
// "Retries"): a server that comes up during the retries is reached, a method not marked is never
// retried, the attempts stop at max_attempts and within the deadline, each seen by the
// interceptors, a call lost with its server's shutdown is made again on the next server only when
// its method is idempotent, and a call waiting to retry ends at once when cancelled or when its
// channel is destroyed.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include "rpc/client/retry.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "rpc/channel.h"
#include "rpc/interceptor.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/rpc/retry.zrpc.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/test_device.h"

namespace {

using zrpc::CallOptions;
using zrpc::testing::Item;
using zrpc::testing::kLong;
using zrpc::testing::Store;
using zrpc::testing::Value;

class CountingStore : public Store::Service {
 public:
  explicit CountingStore(std::string name) : name_(std::move(name)) {}
  absl::Status Get(zrpc::ServerContext& context, const Item& key, Value* value) override {
    return Answer(context, key, value, &gets);
  }
  absl::Status Put(zrpc::ServerContext& context, const Item& key, Value* value) override {
    return Answer(context, key, value, &puts);
  }
  absl::Status Append(zrpc::ServerContext& context, const Item& key, Value* value) override {
    return Answer(context, key, value, &appends);
  }
  std::atomic<int> gets{0};
  std::atomic<int> puts{0};
  std::atomic<int> appends{0};

 private:
  absl::Status Answer(zrpc::ServerContext& context, const Item& key, Value* value,
                      std::atomic<int>* count) {
    count->fetch_add(1);
    // Only the server named "first" holds calls: the one a test shuts down under them.
    const absl::Duration hold =
        name_ == "first" ? absl::Milliseconds(key.hold_ms()) : absl::ZeroDuration();
    const absl::Time until = absl::Now() + hold;
    while (absl::Now() < until && !context.IsCancelled()) absl::SleepFor(absl::Milliseconds(2));
    value->set_id(key.id());
    value->set_server(name_);
    return absl::OkStatus();
  }
  const std::string name_;
};

// A Store server named `name` on `port` (0: any).
struct StoreServer {
  CountingStore service;
  std::unique_ptr<zrpc::Server> server;
  absl::Status started;  // checked by the test's thread (Catch's REQUIRE is for that one only)

  StoreServer(const zrpc::transport::DeviceConfig& config, std::string name, uint16_t port)
      : service(std::move(name)) {
    zrpc::ServerOptions options;
    options.device = config;
    options.port = port;
    auto s = zrpc::Server::Create(options);
    if (!s.ok()) {
      started = s.status();
      return;
    }
    server = std::move(*s);
    started = server->AddService(&service);
    if (started.ok()) started = server->Start();
  }
};

std::unique_ptr<StoreServer> Serve(const zrpc::transport::DeviceConfig& config, std::string name,
                                   uint16_t port) {
  auto server = std::make_unique<StoreServer>(config, std::move(name), port);
  INFO(server->started);
  REQUIRE(server->started.ok());
  return server;
}

// Counts each call's start: one per attempt.
class AttemptCounter : public zrpc::ClientInterceptor {
 public:
  absl::Status OnCallStart(const zrpc::MethodInfo&, zrpc::Metadata&) override {
    attempts.fetch_add(1);
    return absl::OkStatus();
  }
  std::atomic<int> attempts{0};
};

// A port nothing listens on now: a server's, which is then shut down.
uint16_t FreedPort(const zrpc::transport::DeviceConfig& config) {
  std::unique_ptr<StoreServer> once = Serve(config, "once", 0);
  const uint16_t port = once->server->port();
  once->server->Shutdown(absl::ZeroDuration());
  return port;
}

std::unique_ptr<zrpc::ClientChannel> ChannelTo(const zrpc::transport::DeviceConfig& config,
                                               uint16_t port, zrpc::ChannelOptions options,
                                               const std::shared_ptr<AttemptCounter>& counter) {
  options.device = config;
  options.reconnect_backoff_initial = absl::Milliseconds(10);
  options.reconnect_backoff_max = absl::Milliseconds(40);
  options.interceptors.push_back(counter);
  auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(config, port), options);
  REQUIRE(channel.ok());
  return std::move(*channel);
}

zrpc::ChannelOptions Retrying(int attempts, absl::Duration initial, absl::Duration max) {
  zrpc::ChannelOptions options;
  options.retry.max_attempts = attempts;
  options.retry.initial_backoff = initial;
  options.retry.max_backoff = max;
  return options;
}

Item ItemOf(uint64_t id, uint64_t hold_ms = 0) {
  Item key;
  key.set_id(id);
  key.set_hold_ms(hold_ms);
  return key;
}

TEST_CASE("the backoff: each wait in [d/2, d], d doubling from initial_backoff to max_backoff",
          "[retry]") {
  zrpc::ChannelOptions::Retry policy;
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = absl::Milliseconds(300);
  for (double random : {0.0, 0.5, 0.999}) {
    CHECK(zrpc::internal::RetryBackoff(policy, 1, random) >= absl::Milliseconds(25));
    CHECK(zrpc::internal::RetryBackoff(policy, 1, random) <= absl::Milliseconds(50));
    CHECK(zrpc::internal::RetryBackoff(policy, 2, random) >= absl::Milliseconds(50));
    CHECK(zrpc::internal::RetryBackoff(policy, 2, random) <= absl::Milliseconds(100));
    CHECK(zrpc::internal::RetryBackoff(policy, 4, random) >= absl::Milliseconds(150));
    CHECK(zrpc::internal::RetryBackoff(policy, 4, random) <= absl::Milliseconds(300));
    CHECK(zrpc::internal::RetryBackoff(policy, 60, random) <= absl::Milliseconds(300));
  }
}

TEST_CASE("options: max_attempts out of [1, 10] or a backoff that is not positive is refused",
          "[retry]") {
  ZRPC_TEST_DEVICE(config);
  for (const zrpc::ChannelOptions& options :
       {Retrying(0, absl::Milliseconds(1), absl::Milliseconds(1)),
        Retrying(11, absl::Milliseconds(1), absl::Milliseconds(1)),
        Retrying(2, absl::ZeroDuration(), absl::Milliseconds(1)),
        Retrying(2, absl::Milliseconds(2), absl::Milliseconds(1))}) {
    zrpc::ChannelOptions with_device = options;
    with_device.device = config;
    auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(config, 1), with_device);
    CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(channel.status().message(), "ChannelOptions::retry"));
  }
}

TEST_CASE("a server that comes up during the retries is reached; a method not marked fails at once",
          "[retry]") {
  ZRPC_TEST_DEVICE(config);
  const uint16_t port = FreedPort(config);
  auto counter = std::make_shared<AttemptCounter>();
  auto channel = ChannelTo(config, port,
                           Retrying(10, absl::Milliseconds(100), absl::Milliseconds(400)), counter);
  Store::Stub stub(channel.get());
  Value value;
  // Not marked idempotent: one attempt, whatever the policy.
  const absl::Status appended = stub.Append(ItemOf(1), &value, CallOptions::Timeout(kLong));
  INFO(appended);
  CHECK(appended.code() == absl::StatusCode::kUnavailable);
  CHECK(counter->attempts == 1);
  CHECK(channel->stats().retries == 0);
  // Marked: retried until the server that comes up meanwhile answers.
  std::unique_ptr<StoreServer> late;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(150));
    late = std::make_unique<StoreServer>(config, "late", port);
  });
  const absl::Status got = stub.Get(ItemOf(2), &value, CallOptions::Timeout(kLong));
  starter.join();
  REQUIRE(late != nullptr);
  INFO(late->started);
  REQUIRE(late->started.ok());
  INFO(got);
  CHECK(got.ok());
  CHECK(value.server() == "late");
  CHECK(value.id() == 2);
  CHECK(channel->stats().retries >= 1);
  CHECK(counter->attempts == 2 + static_cast<int>(channel->stats().retries));
  CHECK(late->service.gets == 1);
}

TEST_CASE(
    "retries stop at max_attempts, each attempt a call to the interceptors, the waits "
    "between them as the backoff says",
    "[retry]") {
  ZRPC_TEST_DEVICE(config);
  const uint16_t port = FreedPort(config);
  auto counter = std::make_shared<AttemptCounter>();
  auto channel = ChannelTo(config, port,
                           Retrying(3, absl::Milliseconds(100), absl::Milliseconds(400)), counter);
  Store::Stub stub(channel.get());
  Value value;
  const absl::Time start = absl::Now();
  const absl::Status status = stub.Put(ItemOf(3), &value, CallOptions::Timeout(kLong));
  const absl::Duration took = absl::Now() - start;
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(counter->attempts == 3);
  CHECK(channel->stats().retries == 2);
  // Two waits, from [50, 100] ms and [100, 200] ms.
  CHECK(took >= absl::Milliseconds(150));
}

TEST_CASE("the deadline bounds the retries: the last attempt's error, before the deadline",
          "[retry]") {
  ZRPC_TEST_DEVICE(config);
  const uint16_t port = FreedPort(config);
  auto counter = std::make_shared<AttemptCounter>();
  auto channel =
      ChannelTo(config, port, Retrying(10, absl::Milliseconds(200), absl::Seconds(1)), counter);
  Store::Stub stub(channel.get());
  Value value;
  const absl::Time start = absl::Now();
  const absl::Status status =
      stub.Get(ItemOf(4), &value, CallOptions::Timeout(absl::Milliseconds(500)));
  const absl::Duration took = absl::Now() - start;
  INFO(status);
  // The last attempt's error, or the deadline's should it fall during an attempt; never a wait
  // past it.
  CHECK((status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded));
  CHECK(took < absl::Milliseconds(1500));  // the deadline's 500 ms, and slack for sanitizers
  // A first wait of [100, 200] ms, a second of [200, 400] ms only if it ends in time.
  CHECK(counter->attempts >= 2);
  CHECK(counter->attempts <= 3);
}

TEST_CASE("a call its server gives up on while it runs is made again only when idempotent",
          "[retry]") {
  ZRPC_TEST_DEVICE(config);
  std::unique_ptr<StoreServer> first = Serve(config, "first", 0);
  const uint16_t port = first->server->port();
  auto counter = std::make_shared<AttemptCounter>();
  auto channel = ChannelTo(config, port,
                           Retrying(10, absl::Milliseconds(100), absl::Milliseconds(400)), counter);
  Store::Stub stub(channel.get());
  const bool idempotent = GENERATE(true, false);
  INFO((idempotent ? "Put" : "Append"));
  Value value;
  absl::Status status;
  std::thread caller([&] {
    // Held by the handler until the server's shutdown cancels it.
    const Item key = ItemOf(5, 60'000);
    status = idempotent ? stub.Put(key, &value, CallOptions::Timeout(kLong))
                        : stub.Append(key, &value, CallOptions::Timeout(kLong));
  });
  // Not REQUIRE: `caller` must be joined whatever happens (the shutdown below ends its call).
  CHECK(
      zrpc::testing::Eventually([&] { return first->service.puts + first->service.appends == 1; }));
  // The call ran (it is running): the server answers it UNAVAILABLE as it shuts down.
  first->server->Shutdown(absl::ZeroDuration());
  auto second = std::make_unique<StoreServer>(config, "second", port);
  caller.join();
  INFO(second->started);
  REQUIRE(second->started.ok());
  INFO(status);
  INFO("attempts " << counter->attempts << ", retries " << channel->stats().retries
                   << ", second's puts " << second->service.puts);
  if (idempotent) {
    CHECK(status.ok());
    CHECK(value.server() == "second");
    CHECK(second->service.puts == 1);
    CHECK(channel->stats().retries >= 1);
  } else {
    CHECK(status.code() == absl::StatusCode::kUnavailable);
    CHECK(second->service.appends == 0);
    CHECK(counter->attempts == 1);
    CHECK(channel->stats().retries == 0);
  }
}

TEST_CASE("a call waiting to retry ends at once when cancelled, or when its channel goes",
          "[retry]") {
  ZRPC_TEST_DEVICE(config);
  const uint16_t port = FreedPort(config);
  auto counter = std::make_shared<AttemptCounter>();
  auto channel =
      ChannelTo(config, port, Retrying(5, absl::Seconds(20), absl::Seconds(20)), counter);
  Store::Stub stub(channel.get());
  const bool cancel = GENERATE(true, false);
  INFO((cancel ? "cancelled" : "channel destroyed"));
  Value value;
  absl::Notification done;
  absl::Status status;
  CallOptions options = CallOptions::Timeout(absl::Seconds(120));
  options.cancellation = std::make_shared<zrpc::Cancellation>();
  stub.AsyncGet(ItemOf(6), &value, options, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // The first attempt failed (nothing listens), and the call waits 10 to 20 s for its next.
  REQUIRE(zrpc::testing::Eventually([&] { return channel->stats().retries == 1; }));
  CHECK_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  const absl::Time start = absl::Now();
  if (cancel) {
    options.cancellation->Cancel();
  } else {
    channel.reset();
  }
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(absl::Now() - start < absl::Seconds(5));
  INFO(status);
  CHECK(status.code() == absl::StatusCode::kCancelled);
  CHECK(absl::StrContains(status.message(), cancel ? "cancelled" : "destroyed"));
  CHECK(counter->attempts == 1);
}

}  // namespace
