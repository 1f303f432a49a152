// CallOptions::wait_for_ready: a call made while its server is away fails UNAVAILABLE at once
// without it, and with it waits (connecting again as the backoff allows) until the server comes,
// its deadline passes, or it is cancelled. Over fakeverbs, on the host and under ASan.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/fakeverbs/fake_device.h"
#include "tests/rpc/runtime_fixture.h"

namespace {

using zrpc::fakeverbs::FakeDevice;
using zrpc::testing::TestGreeter;

// A port nothing listens on: one a server had, and gave back.
uint16_t FreedPort() {
  zrpc::ServerOptions options;
  options.device = FakeDevice();
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->Start().ok());
  const uint16_t port = (*server)->port();
  (*server)->Shutdown(absl::ZeroDuration());
  return port;
}

std::unique_ptr<zrpc::ClientChannel> ChannelTo(uint16_t port) {
  zrpc::ChannelOptions options;
  options.device = FakeDevice();
  options.reconnect_backoff_initial = absl::Milliseconds(50);
  options.reconnect_backoff_max = absl::Milliseconds(200);
  auto channel = zrpc::CreateChannel(zrpc::testing::TargetOf(FakeDevice(), port), options);
  REQUIRE(channel.ok());
  return *std::move(channel);
}

absl::Status Ping(zrpc::ClientChannel& channel, const zrpc::CallOptions& options) {
  zrpc::examples::Greeter::Stub stub(&channel);
  google::protobuf::Empty request, reply;
  return stub.Ping(request, &reply, options);
}

zrpc::CallOptions WaitingUpTo(absl::Duration timeout) {
  zrpc::CallOptions options = zrpc::CallOptions::Timeout(timeout);
  options.wait_for_ready = true;
  return options;
}

}  // namespace

TEST_CASE(
    "with wait_for_ready a call made while the server is away waits for it; without, it "
    "fails UNAVAILABLE at once",
    "[wait_for_ready]") {
  const uint16_t port = FreedPort();
  auto channel = ChannelTo(port);
  absl::Time start = absl::Now();
  const absl::Status fast = Ping(*channel, zrpc::CallOptions::Timeout(absl::Seconds(10)));
  INFO(fast);
  CHECK(fast.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() - start < absl::Seconds(5));

  constexpr absl::Duration kAway = absl::Milliseconds(400);
  // The server, made now and started once the call has waited kAway.
  TestGreeter greeter;
  zrpc::ServerOptions options;
  options.device = FakeDevice();
  options.port = port;
  auto server = zrpc::Server::Create(options);
  REQUIRE(server.ok());
  REQUIRE((*server)->AddService(&greeter).ok());
  const uint64_t failures_before = channel->stats().connect_failures;
  absl::Status waited;
  const absl::Time began = absl::Now();
  std::thread caller([&] { waited = Ping(*channel, WaitingUpTo(absl::Seconds(20))); });
  absl::SleepFor(kAway);
  const absl::Status started = (*server)->Start();
  caller.join();
  const absl::Duration took = absl::Now() - began;
  REQUIRE(started.ok());
  INFO(waited);
  CHECK(waited.ok());
  CHECK(took >= kAway);
  // It tried again (and failed) while it waited, as the backoff let it.
  CHECK(channel->stats().connect_failures > failures_before);
  // Once connected, a call needs nothing of it.
  CHECK(Ping(*channel, zrpc::CallOptions::Timeout(absl::Seconds(10))).ok());
}

TEST_CASE("a call waiting for its server ends at its deadline, quoting the last attempt",
          "[wait_for_ready]") {
  auto channel = ChannelTo(FreedPort());
  const absl::Time start = absl::Now();
  const absl::Status s = Ping(*channel, WaitingUpTo(absl::Milliseconds(600)));
  const absl::Duration took = absl::Now() - start;
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(s.message().find("the last attempt: ") != absl::string_view::npos);
  CHECK(took >= absl::Milliseconds(550));  // it waited for the whole deadline
  CHECK(took < absl::Seconds(5));
}

TEST_CASE("a call waiting for its server ends when cancelled", "[wait_for_ready]") {
  auto channel = ChannelTo(FreedPort());
  zrpc::CallOptions options;  // no deadline: only the cancellation ends the wait
  options.wait_for_ready = true;
  options.cancellation = std::make_shared<zrpc::Cancellation>();
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    options.cancellation->Cancel();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = Ping(*channel, options);
  const absl::Duration took = absl::Now() - start;
  canceller.join();
  INFO(s);
  CHECK(s.code() == absl::StatusCode::kCancelled);
  CHECK(took >= absl::Milliseconds(250));
  CHECK(took < absl::Seconds(5));
}
