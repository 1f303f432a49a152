// Options a Channel or Server refuses before touching a device: each refusal names the option
// and its bounds (host test: validation runs before the device is opened).
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "rpc/channel.h"
#include "rpc/common/runtime.h"
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

// Each option both sides share (RuntimeOptions) is checked once, for both: a bad value is
// refused by CreateChannel and by Server::Create alike, each naming its own struct's option.
TEST_CASE("each shared option out of range is refused by channels and servers alike") {
  struct Bad {
    const char* option;
    void (*spoil)(RuntimeOptions&);
  };
  const Bad cases[] = {
      {"pollers", [](RuntimeOptions& o) { o.pollers = 0; }},
      {"pollers", [](RuntimeOptions& o) { o.pollers = 65; }},
      {"max_message_size", [](RuntimeOptions& o) { o.max_message_size = 0; }},
      {"max_message_size", [](RuntimeOptions& o) { o.max_message_size = uint64_t{1} << 31; }},
      {"max_bulk_size", [](RuntimeOptions& o) { o.max_bulk_size = 0; }},
      {"max_bulk_size", [](RuntimeOptions& o) { o.max_bulk_size = uint64_t{1} << 32; }},
      {"max_bulk_size", [](RuntimeOptions& o) { o.max_pulled_bytes = o.max_bulk_size - 1; }},
      {"stream_window", [](RuntimeOptions& o) { o.stream_window = 0; }},
  };
  for (const Bad& bad : cases) {
    INFO(bad.option);
    ChannelOptions channel_options;
    bad.spoil(channel_options);
    auto channel = CreateChannel("127.0.0.1:7471", channel_options);
    REQUIRE_FALSE(channel.ok());
    CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(channel.status().message(),
                            std::string("ChannelOptions::") + bad.option));

    ServerOptions server_options;
    bad.spoil(server_options);
    auto server = Server::Create(server_options);
    REQUIRE_FALSE(server.ok());
    CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(
        absl::StrContains(server.status().message(), std::string("ServerOptions::") + bad.option));
  }
}

TEST_CASE("the values at each shared option's bounds pass the checks") {
  RuntimeOptions options;
  options.pollers = 64;
  options.max_message_size = (uint64_t{1} << 31) - 1;
  options.max_bulk_size = (uint64_t{1} << 32) - 1;
  options.max_pulled_bytes = options.max_bulk_size;
  options.stream_window = 1;
  options.spin = absl::Seconds(1);
  CHECK(internal::CheckRuntimeOptions(options, "ChannelOptions").ok());
  options.pollers = 1;
  options.max_message_size = 1;
  options.max_bulk_size = 1;
  options.spin = absl::ZeroDuration();
  CHECK(internal::CheckRuntimeOptions(options, "ServerOptions").ok());
}

TEST_CASE("ServerOptions::max_pollers below 0 or past 64 is refused, naming the option") {
  for (const auto& [pollers, max_pollers] :
       std::vector<std::pair<int, int>>{{1, 65}, {1, -1}, {4, 65}}) {
    ServerOptions options;
    options.pollers = pollers;
    options.max_pollers = max_pollers;
    auto server = Server::Create(options);
    REQUIRE_FALSE(server.ok());
    INFO(server.status());
    CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(server.status().message(),
                            "ServerOptions::max_pollers is " + std::to_string(max_pollers)));
  }
}

TEST_CASE("max_pollers whose shared receive queues pass the slot pool's cap is refused") {
  ServerOptions options;
  options.pollers = 1;
  options.max_pollers = 17;
  options.shared_receive_queue = 4096;
  options.slots.max_slots = 65536;
  auto server = Server::Create(options);
  REQUIRE_FALSE(server.ok());
  INFO(server.status());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(server.status().message(), "take 69632 slots"));
  CHECK(absl::StrContains(server.status().message(), "slots.max_slots = 65536"));
}

TEST_CASE(
    "pollers made at once whose default shared receive queues fill the slot pool are refused") {
  ServerOptions options;
  options.pollers = 32;  // 32 x 4096: the whole default pool, nothing left for sends
  auto server = Server::Create(options);
  REQUIRE_FALSE(server.ok());
  INFO(server.status());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(
      absl::StrContains(server.status().message(), "32 pollers (pollers = 32, max_pollers = 16)"));
  CHECK(absl::StrContains(server.status().message(), "take 131072 slots"));
}

TEST_CASE("park_windows is refused on a channel, and on a server without a shared receive queue") {
  ChannelOptions channel_options;
  channel_options.park_windows = true;
  auto channel = CreateChannel("127.0.0.1:7471", channel_options);
  REQUIRE_FALSE(channel.ok());
  CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(channel.status().message(), "ChannelOptions::park_windows"));

  ServerOptions options;
  options.park_windows = true;
  options.shared_receive_queue = 0;
  auto server = Server::Create(options);
  REQUIRE_FALSE(server.ok());
  INFO(server.status());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(server.status().message(),
                          "ServerOptions::park_windows is set with shared_receive_queue = 0"));
}

}  // namespace
}  // namespace zrpc
