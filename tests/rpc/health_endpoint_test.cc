// A server's /healthz, /readyz and /connections on its metrics endpoint (ServerOptions::
// metrics_address): /healthz answers while the process does; /readyz says ready once the server
// has started and 503 from the moment Shutdown begins, through its grace period, while a call
// still runs; /connections lists each connection, as text and JSON. Over
// fakeverbs (the endpoint is plain TCP; the server's device does not matter here).
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/eventually.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/scrape.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;

// SayHello("hold") holds its call until `release`.
class HoldingGreeter : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext&, const HelloRequest& request,
                        HelloReply* reply) override {
    if (request.name() == "hold") {
      held.Notify();
      release.WaitForNotification();
    }
    reply->set_message("hi");
    return absl::OkStatus();
  }
  absl::Notification held, release;
};

zrpc::testing::HttpResponse Get(uint16_t port, const std::string& path) {
  return zrpc::testing::Curl(absl::StrCat("http://127.0.0.1:", port, path));
}

TEST_CASE("/healthz answers while the server runs; /readyz turns 503 as Shutdown begins",
          "[health]") {
  const zrpc::transport::DeviceConfig config = zrpc::fakeverbs::FakeDevice();
  HoldingGreeter service;
  zrpc::ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  zrpc::testing::Served served(config, {&service}, options, {}, {"zrpc.examples.Greeter/SayHello"});
  const uint16_t port = served.server->metrics_port();
  REQUIRE(port != 0);
  zrpc::testing::HttpResponse health = Get(port, "/healthz");
  REQUIRE(health.curl_exit == 0);
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");
  zrpc::testing::HttpResponse ready = Get(port, "/readyz");
  CHECK(ready.status == 200);
  CHECK(ready.body == "ready\n");

  // A call the handler holds keeps Shutdown in its grace period.
  Greeter::Stub stub(served.channel.get());
  zrpc::testing::HelloBatch held_call(stub, {"hold"}, zrpc::testing::kLong);
  service.held.WaitForNotification();

  // /connections: the one connection, its caller's address, the held call; as JSON too.
  const zrpc::testing::HttpResponse connections = Get(port, "/connections");
  INFO(connections.body);
  CHECK(connections.status == 200);
  const std::vector<std::string> lines = absl::StrSplit(connections.body, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 2);
  CHECK(absl::StartsWith(lines[0], "# 1 connections"));
  CHECK(absl::StartsWith(lines[1], absl::StrCat(config.addr, ":")));
  CHECK(absl::StrContains(lines[1], " open calls=1 "));
  const zrpc::testing::HttpResponse as_json = Get(port, "/connections.json");
  CHECK(absl::StrContains(as_json.headers, "Content-Type: application/json"));
  // Read back by a real JSON parser: the fields a dashboard would take.
  const zrpc::testing::CommandResult parsed = zrpc::testing::RunCommand(
      "python3 -c 'import json,sys; c=json.load(sys.stdin)[\"connections\"]; "
      "print(len(c), c[0][\"calls_in_flight\"], c[0][\"open\"], "
      "c[0][\"peer\"].rsplit(\":\", 1)[0], c[0][\"transport\"][\"messages_received\"] >= 1)'",
      as_json.body);
  INFO(as_json.body);
  INFO(parsed.output);
  CHECK(parsed.exit_code == 0);
  CHECK(parsed.output == absl::StrCat("1 1 True ", config.addr, " True\n"));
  std::thread shutdown([&] { served.server->Shutdown(zrpc::testing::kLong); });
  CHECK(zrpc::testing::Eventually([&] { return Get(port, "/readyz").status == 503; }));
  const zrpc::testing::HttpResponse draining = Get(port, "/readyz");
  CHECK(draining.status == 503);
  CHECK(draining.body == "not ready: shutting down\n");
  CHECK(Get(port, "/healthz").status == 200);  // the process still answers
  CHECK(Get(port, "/metrics").status == 200);
  service.release.Notify();
  shutdown.join();
  REQUIRE(held_call.Wait(zrpc::testing::kLong));
  INFO(held_call.status(0));
  CHECK(held_call.status(0).ok());  // the grace period let it finish
  // The endpoint goes with the server.
  CHECK(Get(port, "/healthz").curl_exit != 0);
}

}  // namespace
