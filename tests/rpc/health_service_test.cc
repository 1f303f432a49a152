// The health service every server answers (zrpc.health.v1.Health, rpc/health/health_service.h):
// Check and Watch for the server ("") and each service, SetServingStatus, NOT_SERVING from the
// moment Shutdown begins, watchers finished so Shutdown is not kept waiting, a watcher that gives
// up, and the option that turns the service off.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "proto/zrpc/health.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/test_device.h"

namespace {

using zrpc::health::v1::Health;
using zrpc::health::v1::HealthCheckRequest;
using zrpc::health::v1::HealthCheckResponse;
using zrpc::testing::kLong;
using zrpc::testing::Within;
using Status = HealthCheckResponse::ServingStatus;

constexpr const char* kGreeter = "zrpc.examples.Greeter";

class Greeter : public zrpc::examples::Greeter::Service {};  // never called here

HealthCheckRequest For(const std::string& service) {
  HealthCheckRequest request;
  request.set_service(service);
  return request;
}

// Check's answer: the status, or the error's code as a negative number.
int Check(zrpc::ClientChannel& channel, const std::string& service) {
  Health::Stub stub(&channel);
  HealthCheckResponse reply;
  const absl::Status s = stub.Check(For(service), &reply, Within(kLong));
  if (!s.ok()) return -static_cast<int>(s.code());
  return reply.status();
}

// A Watch read on a thread of its own: every status it is sent, and how it ended.
class Watch {
 public:
  Watch(zrpc::ClientChannel& channel, const std::string& service) {
    options_.cancellation = cancellation_;
    reader_ = std::thread([this, &channel, service] {
      Health::Stub stub(&channel);
      zrpc::ClientReader<HealthCheckResponse> reader = stub.Watch(For(service), options_);
      HealthCheckResponse status;
      while (reader.Read(&status)) {
        absl::MutexLock lock(&mu_);
        seen_.push_back(status.status());
      }
      absl::Status end = reader.Finish();
      absl::MutexLock lock(&mu_);
      end_ = end;
      ended_ = true;
    });
  }
  // Gives up first: a watch open lasts for as long as its server.
  ~Watch() {
    Cancel();
    Join();
  }
  void Join() {
    if (reader_.joinable()) reader_.join();
  }
  void Cancel() { cancellation_->Cancel(); }
  std::vector<int> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  // True once the statuses seen end with `last`.
  bool Saw(int last) {
    absl::MutexLock lock(&mu_);
    return !seen_.empty() && seen_.back() == last;
  }
  bool ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  absl::Status end() {
    absl::MutexLock lock(&mu_);
    return end_;
  }

 private:
  std::shared_ptr<zrpc::Cancellation> cancellation_ = std::make_shared<zrpc::Cancellation>();
  zrpc::CallOptions options_;
  absl::Mutex mu_;
  std::vector<int> seen_ ABSL_GUARDED_BY(mu_);
  absl::Status end_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace

TEST_CASE("Check says SERVING for the server and each service from Start, NOT_FOUND otherwise",
          "[health]") {
  ZRPC_TEST_DEVICE(config);
  Greeter greeter;
  zrpc::testing::Served served(config, {&greeter});
  CHECK(Check(*served.channel, "") == HealthCheckResponse::SERVING);
  CHECK(Check(*served.channel, kGreeter) == HealthCheckResponse::SERVING);
  CHECK(Check(*served.channel, "zrpc.health.v1.Health") == HealthCheckResponse::SERVING);
  CHECK(Check(*served.channel, "no.Such") == -static_cast<int>(absl::StatusCode::kNotFound));
  served.server->SetServingStatus(kGreeter, false);
  CHECK(Check(*served.channel, kGreeter) == HealthCheckResponse::NOT_SERVING);
  CHECK(Check(*served.channel, "") == HealthCheckResponse::SERVING);  // each name its own
  served.server->SetServingStatus("any.Name", true);  // a name the server does not serve
  CHECK(Check(*served.channel, "any.Name") == HealthCheckResponse::SERVING);
  served.server->SetServingStatus(kGreeter, true);
  CHECK(Check(*served.channel, kGreeter) == HealthCheckResponse::SERVING);
}

TEST_CASE("a status set before Start stays: Start makes SERVING only what has no status",
          "[health]") {
  ZRPC_TEST_DEVICE(config);
  Greeter greeter;
  zrpc::ServerOptions options;
  options.device = config;
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&greeter).ok());
  (*server)->SetServingStatus(kGreeter, false);
  REQUIRE((*server)->Start().ok());
  zrpc::ChannelOptions channel_options;
  channel_options.device = config;
  auto channel =
      zrpc::CreateChannel(zrpc::testing::TargetOf(config, (*server)->port()), channel_options);
  REQUIRE(channel.ok());
  CHECK(Check(**channel, kGreeter) == HealthCheckResponse::NOT_SERVING);
  CHECK(Check(**channel, "") == HealthCheckResponse::SERVING);
}

TEST_CASE("Watch sends the status now and each change; a watcher that gives up is let go",
          "[health]") {
  ZRPC_TEST_DEVICE(config);
  Greeter greeter;
  zrpc::testing::Served served(config, {&greeter});
  Watch greeter_watch(*served.channel, kGreeter);
  Watch unknown_watch(*served.channel, "later.Service");
  REQUIRE(
      zrpc::testing::Eventually([&] { return greeter_watch.Saw(HealthCheckResponse::SERVING); }));
  REQUIRE(zrpc::testing::Eventually(
      [&] { return unknown_watch.Saw(HealthCheckResponse::SERVICE_UNKNOWN); }));
  served.server->SetServingStatus(kGreeter, false);
  REQUIRE(zrpc::testing::Eventually(
      [&] { return greeter_watch.Saw(HealthCheckResponse::NOT_SERVING); }));
  served.server->SetServingStatus("later.Service", true);
  REQUIRE(
      zrpc::testing::Eventually([&] { return unknown_watch.Saw(HealthCheckResponse::SERVING); }));
  served.server->SetServingStatus(kGreeter, true);
  REQUIRE(
      zrpc::testing::Eventually([&] { return greeter_watch.Saw(HealthCheckResponse::SERVING); }));
  // Setting a status to what it is sends nothing: by the time a later change to another name
  // arrived, anything the first would have sent has arrived too (one Flush sends both).
  served.server->SetServingStatus(kGreeter, true);
  served.server->SetServingStatus("later.Service", false);
  REQUIRE(zrpc::testing::Eventually(
      [&] { return unknown_watch.Saw(HealthCheckResponse::NOT_SERVING); }));
  CHECK(greeter_watch.seen() == std::vector<int>{HealthCheckResponse::SERVING,
                                                 HealthCheckResponse::NOT_SERVING,
                                                 HealthCheckResponse::SERVING});
  CHECK(unknown_watch.seen() == std::vector<int>{HealthCheckResponse::SERVICE_UNKNOWN,
                                                 HealthCheckResponse::SERVING,
                                                 HealthCheckResponse::NOT_SERVING});

  // A watcher that cancels ends at once on its side, and the server lets its stream go with no
  // status change to find it out (each connection has 16 streams: a cancelled watch must not
  // keep one). Check and the other watcher go on.
  CHECK(served.server->stats().calls_in_flight == 2);
  unknown_watch.Cancel();
  REQUIRE(zrpc::testing::Eventually([&] { return unknown_watch.ended(); }));
  CHECK(unknown_watch.end().code() == absl::StatusCode::kCancelled);
  CHECK(zrpc::testing::Eventually([&] { return served.server->stats().calls_in_flight == 1; },
                                  absl::Seconds(10)));
  served.server->SetServingStatus(kGreeter, false);
  REQUIRE(zrpc::testing::Eventually(
      [&] { return greeter_watch.Saw(HealthCheckResponse::NOT_SERVING); }));
  CHECK(Check(*served.channel, "later.Service") == HealthCheckResponse::NOT_SERVING);
}

TEST_CASE("Shutdown tells every watcher NOT_SERVING and finishes its stream within the grace",
          "[health]") {
  ZRPC_TEST_DEVICE(config);
  Greeter greeter;
  zrpc::testing::Served served(config, {&greeter});
  std::vector<std::unique_ptr<Watch>> watches;
  for (const char* name : {"", kGreeter, "never.Set"}) {
    watches.push_back(std::make_unique<Watch>(*served.channel, name));
  }
  for (auto& watch : watches) {
    REQUIRE(zrpc::testing::Eventually([&] { return !watch->seen().empty(); }));
  }
  const absl::Time start = absl::Now();
  served.server->Shutdown(absl::Seconds(30));
  // Watch streams would last for ever: Shutdown finishes them instead of waiting out its grace.
  CHECK(absl::Now() - start < absl::Seconds(10));
  for (auto& watch : watches) watch->Join();
  CHECK(watches[0]->seen() ==
        std::vector<int>{HealthCheckResponse::SERVING, HealthCheckResponse::NOT_SERVING});
  CHECK(watches[1]->seen() ==
        std::vector<int>{HealthCheckResponse::SERVING, HealthCheckResponse::NOT_SERVING});
  // A name never set stays unknown to the end.
  CHECK(watches[2]->seen() == std::vector<int>{HealthCheckResponse::SERVICE_UNKNOWN});
  for (auto& watch : watches) {
    INFO(watch->end());
    CHECK(watch->end().ok());
  }
  served.server->SetServingStatus(kGreeter, true);  // after Shutdown: nothing, and no crash
}

TEST_CASE("without health_service the server does not answer it", "[health]") {
  ZRPC_TEST_DEVICE(config);
  Greeter greeter;
  zrpc::ServerOptions options;
  options.health_service = false;
  zrpc::testing::Served served(config, {&greeter}, options);
  CHECK(Check(*served.channel, "") == -static_cast<int>(absl::StatusCode::kUnimplemented));
  served.server->SetServingStatus("", false);  // does nothing
}
