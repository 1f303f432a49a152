// ServerContext's view of who called: the client's address as its connection came in, and the id
// of the pre-shared key it proved (0 without authentication), the same for every call of one
// connection and apart for two connections.
//
// Built twice: over fakeverbs on the host (ZRPC_OVER_FAKEVERBS) and on the harness's device (tag
// "rdma").
#include "rpc/server_context.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/rpc/runtime_fixture.h"
#include "tests/rpc/test_device.h"
#include "transport/options.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::testing::kLong;
using zrpc::testing::Named;
using zrpc::testing::Within;

// Answers with what its context says of the caller: "<peer>|<key id>".
class WhoCalled : public Greeter::Service {
 public:
  absl::Status SayHello(zrpc::ServerContext& context, const zrpc::examples::HelloRequest&,
                        HelloReply* reply) override {
    reply->set_message(absl::StrCat(context.peer(), "|", context.auth_key_id()));
    return absl::OkStatus();
  }
};

struct Caller {
  std::string host;
  uint16_t port = 0;
  uint32_t key_id = 0;
};

// Calls through `channel` and splits the answer. "[v6]:port" loses its brackets.
Caller Ask(zrpc::ClientChannel& channel) {
  Greeter::Stub stub(&channel);
  HelloReply reply;
  const absl::Status s = stub.SayHello(Named("me"), &reply, Within(kLong));
  INFO(s);
  REQUIRE(s.ok());
  const std::string& answer = reply.message();
  INFO(answer);
  const size_t bar = answer.rfind('|');
  REQUIRE(bar != std::string::npos);
  const absl::string_view peer = absl::string_view(answer).substr(0, bar);
  const size_t colon = peer.rfind(':');
  REQUIRE(colon != absl::string_view::npos);
  Caller caller;
  caller.host = std::string(peer.substr(0, colon));
  if (caller.host.size() > 2 && caller.host.front() == '[' && caller.host.back() == ']') {
    caller.host = caller.host.substr(1, caller.host.size() - 2);
  } else {
    CHECK(caller.host.find(':') == std::string::npos);  // an IPv6 address is in brackets
  }
  uint32_t port = 0;
  REQUIRE(absl::SimpleAtoi(peer.substr(colon + 1), &port));
  REQUIRE(port > 0);
  REQUIRE(port <= 65535);
  caller.port = static_cast<uint16_t>(port);
  REQUIRE(absl::SimpleAtoi(absl::string_view(answer).substr(bar + 1), &caller.key_id));
  return caller;
}

std::unique_ptr<zrpc::ClientChannel> ChannelTo(const zrpc::transport::DeviceConfig& config,
                                               uint16_t port,
                                               std::vector<zrpc::transport::AuthKey> keys = {}) {
  zrpc::ChannelOptions options;
  options.device = config;
  options.connection.auth_keys = std::move(keys);
  auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(config, port), options);
  INFO(channel.status());
  REQUIRE(channel.ok());
  return *std::move(channel);
}

TEST_CASE("a handler sees the caller's address, one per connection, and no key id without keys",
          "[context]") {
  ZRPC_TEST_DEVICE(config);
  WhoCalled service;
  zrpc::testing::Served served(config, {&service});
  const uint16_t server_port = served.server->port();
  const Caller first = Ask(*served.channel);
  // Client and server share the device's one address here.
  CHECK(first.host == config.addr);
  CHECK(first.port != server_port);
  CHECK(first.key_id == 0);
  // The same connection: the same caller.
  const Caller again = Ask(*served.channel);
  CHECK(again.host == first.host);
  CHECK(again.port == first.port);
  // Another channel's connection comes from another port.
  auto other = ChannelTo(config, server_port);
  const Caller second = Ask(*other);
  CHECK(second.host == config.addr);
  CHECK(second.port != first.port);
}

TEST_CASE("a handler sees the id of the key its caller proved", "[context]") {
  ZRPC_TEST_DEVICE(config);
  const zrpc::transport::AuthKey seven{7, "seven-secret-seven-secret-seven-s"};
  const zrpc::transport::AuthKey nine{9, "nine-secret-nine-secret-nine-secr"};
  zrpc::ServerOptions server_options;
  server_options.listener.connection.auth_keys = {seven, nine};
  zrpc::ChannelOptions channel_options;
  channel_options.connection.auth_keys = {nine};
  WhoCalled service;
  zrpc::testing::Served served(config, {&service}, server_options, channel_options);
  CHECK(Ask(*served.channel).key_id == 9);
  auto other = ChannelTo(config, served.server->port(), {seven});
  CHECK(Ask(*other).key_id == 7);
}

TEST_CASE("a context the runtime did not fill names no caller; a test may set one", "[context]") {
  zrpc::ServerContext context;
  CHECK(context.peer().empty());
  CHECK(context.auth_key_id() == 0);
  const std::string peer = "[fe80::1]:40000";
  context.SetPeer(peer, 3);
  CHECK(context.peer() == peer);
  CHECK(context.auth_key_id() == 3);
}

}  // namespace
