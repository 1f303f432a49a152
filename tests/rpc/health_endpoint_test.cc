// A server's /healthz, /readyz and /connections on its metrics endpoint (ServerOptions::
// metrics_address): /healthz answers while the process does; /readyz says ready once the server
// has started and 503 from the moment Shutdown begins, through its grace period, while a call
// still runs; /connections lists each connection, as text and JSON, with the bytes it moved, the
// registered memory it holds and the last thing that went wrong on it. Over fakeverbs (the
// endpoint is plain TCP; the server's device does not matter here).
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
#include "proto/examples/numbers.zrpc.h"
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

// What a Python program (`python3 -c`) that reads the JSON document `json` on its standard input
// prints: read back by a real JSON parser, as a dashboard would. Empty when it fails.
std::string ReadJson(const std::string& program, const std::string& json) {
  const zrpc::testing::CommandResult result =
      zrpc::testing::RunCommand(absl::StrCat("python3 -c 'import json,sys; ", program, "'"), json);
  INFO(json);
  INFO(result.output);
  CHECK(result.exit_code == 0);
  return result.exit_code == 0 ? result.output : "";
}

// A server with a metrics endpoint on loopback and a channel to it, over fakeverbs.
struct Endpoint {
  explicit Endpoint(std::vector<std::string> pool_methods = {})
      : served(config, {&service}, Options(), {}, pool_methods),
        port(served.server->metrics_port()) {
    REQUIRE(port != 0);
  }
  static zrpc::ServerOptions Options() {
    zrpc::ServerOptions options;
    options.metrics_address = "127.0.0.1:0";
    return options;
  }
  const zrpc::transport::DeviceConfig config = zrpc::fakeverbs::FakeDevice();
  HoldingGreeter service;
  zrpc::testing::Served served;
  const uint16_t port;
};

TEST_CASE("/healthz answers while the server runs; /readyz turns 503 as Shutdown begins",
          "[health]") {
  Endpoint endpoint({"zrpc.examples.Greeter/SayHello"});
  const zrpc::transport::DeviceConfig& config = endpoint.config;
  HoldingGreeter& service = endpoint.service;
  zrpc::testing::Served& served = endpoint.served;
  const uint16_t port = endpoint.port;
  zrpc::testing::HttpResponse health = Get(port, "/healthz");
  REQUIRE(health.curl_exit == 0);
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");
  zrpc::testing::HttpResponse ready = Get(port, "/readyz");
  CHECK(ready.status == 200);
  CHECK(ready.body == "ready\n");

  // A call the handler holds keeps Shutdown in its grace period. Before it, one with a large
  // name, which /connections counts in the bytes received.
  Greeter::Stub stub(served.channel.get());
  {
    HelloRequest request;
    request.set_name(std::string(20000, 'n'));
    HelloReply reply;
    REQUIRE(stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(zrpc::testing::kLong)).ok());
  }
  zrpc::testing::HelloBatch held_call(stub, {"hold"}, zrpc::testing::kLong);
  service.held.WaitForNotification();

  // /connections: the one connection, its caller's address, the held call; as JSON too.
  const zrpc::testing::HttpResponse connections = Get(port, "/connections");
  INFO(connections.body);
  CHECK(connections.status == 200);
  const std::vector<std::string> lines = absl::StrSplit(connections.body, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 3);
  CHECK(absl::StartsWith(lines[0], "# 1 connections"));
  CHECK(absl::StartsWith(lines[2], "# 0 recently closed"));
  CHECK(absl::StartsWith(lines[1], absl::StrCat(config.addr, ":")));
  CHECK(absl::StrContains(lines[1], " open calls=1 "));
  const zrpc::testing::HttpResponse as_json = Get(port, "/connections.json");
  CHECK(absl::StrContains(as_json.headers, "Content-Type: application/json"));
  // Read back by a real JSON parser: the fields a dashboard would take.
  CHECK(ReadJson(
            "c=json.load(sys.stdin)[\"connections\"]; "
            "print(len(c), c[0][\"calls_in_flight\"], c[0][\"open\"], "
            "c[0][\"peer\"].rsplit(\":\", 1)[0], c[0][\"transport\"][\"messages_received\"] >= 1)",
            as_json.body) == absl::StrCat("1 1 True ", config.addr, " True\n"));
  // Bytes each way and registered memory held: the 20,000-byte name went in (a large body,
  // written into the arena), something came out, and the connection holds its own slots and
  // arena (about 400 KiB with the defaults); nothing went wrong yet.
  CHECK(ReadJson("t=json.load(sys.stdin)[\"connections\"][0]; "
                 "x=t[\"transport\"]; print(x[\"bytes_received\"] > 20000, x[\"bytes_sent\"] > 0, "
                 "x[\"registered_bytes\"] > 65536, t[\"last_error\"])",
                 Get(port, "/connections.json").body) == "True True True None\n");
  CHECK(absl::StrContains(lines[1], " registered="));
  CHECK(!absl::StrContains(lines[1], "last_error="));
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

TEST_CASE("/connections shows the last error on a connection: a call the runtime refused",
          "[health]") {
  Endpoint endpoint;
  const zrpc::transport::DeviceConfig& config = endpoint.config;
  zrpc::testing::Served& served = endpoint.served;
  const uint16_t port = endpoint.port;
  // The server has no Numbers service: the call is refused UNIMPLEMENTED, the connection stays.
  zrpc::examples::Numbers::Stub numbers(served.channel.get());
  zrpc::examples::Number in, out;
  const absl::Status refused =
      numbers.Square(in, &out, zrpc::CallOptions::Timeout(zrpc::testing::kLong));
  REQUIRE(refused.code() == absl::StatusCode::kUnimplemented);

  const zrpc::testing::HttpResponse text = Get(port, "/connections");
  INFO(text.body);
  const std::vector<std::string> lines = absl::StrSplit(text.body, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 3);
  CHECK(absl::StrContains(lines[1], " open "));
  CHECK(absl::StrContains(lines[1], " refused: UNIMPLEMENTED: this server has no service with id"));
  CHECK(absl::StrContains(lines[1], "s ago)"));
  CHECK(ReadJson("e=json.load(sys.stdin)[\"connections\"][0][\"last_error\"]; "
                 "print(e[\"message\"].split(\":\")[0], 0 <= e[\"seconds_ago\"] < 60)",
                 Get(port, "/connections.json").body) == "call 1 refused True\n");

  // The client goes: its connection leaves the list and stays among the recently closed, with
  // its last error. A client going away is ordinary, not an error: the refusal stays the last.
  served.channel.reset();
  REQUIRE(zrpc::testing::Eventually(
      [&] { return absl::StrContains(Get(port, "/connections").body, "# 1 recently closed"); }));
  const zrpc::testing::HttpResponse after = Get(port, "/connections");
  INFO(after.body);
  const std::vector<std::string> after_lines = absl::StrSplit(after.body, '\n', absl::SkipEmpty());
  REQUIRE(after_lines.size() == 3);
  CHECK(absl::StartsWith(after_lines[0], "# 0 connections"));
  CHECK(absl::StartsWith(after_lines[2], absl::StrCat(config.addr, ":")));
  CHECK(absl::StrContains(after_lines[2], " closed="));
  CHECK(absl::StrContains(after_lines[2], " last_error=\"call 1 refused: UNIMPLEMENTED: "));
  CHECK(ReadJson("d=json.load(sys.stdin); c=d[\"recently_closed\"]; "
                 "print(len(d[\"connections\"]), len(c), c[0][\"last_error\"][\"message\"][:14], "
                 "c[0][\"age_seconds\"] >= 0)",
                 Get(port, "/connections.json").body) == "0 1 call 1 refused True\n");
}

TEST_CASE("/connections keeps the last 16 connections to close, newest last", "[health]") {
  Endpoint endpoint;
  const zrpc::transport::DeviceConfig& config = endpoint.config;
  zrpc::testing::Served& served = endpoint.served;
  const uint16_t port = endpoint.port;
  served.channel.reset();
  zrpc::ChannelOptions channel_options;
  channel_options.device = config;
  for (int i = 0; i < 17; ++i) {
    INFO("channel " << i);
    auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(config, served.server->port()),
                                       channel_options);
    REQUIRE(channel.ok());
    Greeter::Stub stub(channel->get());
    HelloRequest request;
    HelloReply reply;
    REQUIRE(stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(zrpc::testing::kLong)).ok());
  }
  // Every channel's connections gone (one or more each; the fixture's channel never connected).
  const bool all_closed = zrpc::testing::Eventually([&] {
    const zrpc::ServerStats stats = served.server->stats();
    return stats.connections_open == 0 && stats.connections_closed >= 17;
  });
  INFO("closed " << served.server->stats().connections_closed << ", open "
                 << served.server->stats().connections_open);
  REQUIRE(all_closed);
  const zrpc::testing::HttpResponse page = Get(port, "/connections");
  INFO(page.body);
  const std::vector<std::string> lines = absl::StrSplit(page.body, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 18);
  CHECK(absl::StartsWith(lines[0], "# 0 connections"));
  CHECK(absl::StartsWith(lines[1], "# 16 recently closed"));
}

}  // namespace
