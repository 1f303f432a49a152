// Options a Channel or Server refuses before touching a device: each refusal names the option
// and its bounds (host test: validation runs before the device is opened).
#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "rpc/channel.h"
#include "rpc/server.h"

namespace zrpc {
namespace {

TEST_CASE("spin out of [0, 1s] is refused by channels and servers, naming the option") {
  for (absl::Duration spin : {absl::Microseconds(-1), absl::Seconds(1) + absl::Nanoseconds(1),
                              absl::InfiniteDuration()}) {
    ChannelOptions channel_options;
    channel_options.spin = spin;
    auto channel = CreateChannel("127.0.0.1:7471", channel_options);
    REQUIRE_FALSE(channel.ok());
    CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(channel.status().message(), "ChannelOptions::spin"));

    ServerOptions server_options;
    server_options.spin = spin;
    auto server = Server::Create(server_options);
    REQUIRE_FALSE(server.ok());
    CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(server.status().message(), "ServerOptions::spin"));
  }
}

}  // namespace
}  // namespace zrpc
