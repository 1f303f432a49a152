// Calls between two hosts over a link that misbehaves (tag "two_hosts": tools/test runs it in a
// `tools/softroce start --hosts 2` session). The server is rpc_peer in guest b; the channel is
// here, in guest a; tools/softroce-link on the host carries every frame between them and loses,
// or stops, what the test asks it to.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"
#include "tests/hosts/two_hosts.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;
using zrpc::testing::Link;
using zrpc::testing::LinkCount;
using zrpc::testing::RemotePeer;
using zrpc::testing::Runfile;

// rpc_peer serving Greeter in guest b, and a channel to it from here.
struct Remote {
  Remote(const zrpc::transport::DeviceConfig& config, const zrpc::testing::TwoHosts& hosts)
      : server(hosts, {Runfile("tests/rpc/rpc_peer"), "server", "0"}) {
    const std::string line = server.ReadLine(absl::Seconds(60));
    INFO("rpc_peer in guest b said: \"" << line << "\"");
    int port = 0;
    REQUIRE(std::sscanf(line.c_str(), "listening %d", &port) == 1);
    zrpc::ChannelOptions options;
    options.device = config;
    auto created = zrpc::CreateChannel(absl::StrCat(hosts.peer_addr, ":", port), options);
    INFO(created.status());
    REQUIRE(created.ok());
    channel = *std::move(created);
    const absl::Status connected = channel->Connect(absl::Now() + absl::Seconds(30));
    INFO(connected);
    REQUIRE(connected.ok());
    stub = std::make_unique<Greeter::Stub>(channel.get());
  }

  // `n` calls one after another, each with `deadline`; the count of those that failed.
  int Calls(int n, const std::string& name, absl::Duration deadline) {
    int failed = 0;
    for (int i = 0; i < n; ++i) {
      HelloRequest request;
      request.set_name(name);
      HelloReply reply;
      zrpc::CallOptions call;
      call.deadline = absl::Now() + deadline;
      const absl::Status s = stub->SayHello(request, &reply, call);
      if (!s.ok() || reply.message() != "Hello, " + name) {
        UNSCOPED_INFO("call " << i << ": " << s);
        ++failed;
      }
    }
    return failed;
  }

  RemotePeer server;
  std::unique_ptr<zrpc::ClientChannel> channel;
  std::unique_ptr<Greeter::Stub> stub;
};

// Clears the link's faults when a test case ends, however it ends.
struct CleanLink {
  explicit CleanLink(const zrpc::testing::TwoHosts& hosts) : hosts(hosts) {}
  ~CleanLink() {
    (void)Link(hosts, "faults both none");
    (void)Link(hosts, "up b");
  }
  const zrpc::testing::TwoHosts& hosts;
};

TEST_CASE("calls between two hosts: a channel in guest a, a server in guest b") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  Remote remote(config, config_hosts);
  const auto before = Link(config_hosts, "stats");
  REQUIRE(before.ok());
  CHECK(remote.Calls(200, "across", absl::Seconds(10)) == 0);
  const auto after = Link(config_hosts, "stats");
  REQUIRE(after.ok());
  // The calls went through the link (not through some other path between the two kernels).
  CHECK(LinkCount(*after, "a>b", "delivered") - LinkCount(*before, "a>b", "delivered") >= 200);
  CHECK(LinkCount(*after, "b>a", "delivered") - LinkCount(*before, "b>a", "delivered") >= 200);
}

TEST_CASE("frames lost both ways at 1 % and 5 %: every call succeeds, the connection stays") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  Remote remote(config, config_hosts);
  for (const char* loss : {"0.01", "0.05"}) {
    INFO("loss " << loss);
    REQUIRE(Link(config_hosts, absl::StrCat("faults both seed=11 loss=", loss)).ok());
    const auto before = Link(config_hosts, "stats");
    REQUIRE(before.ok());
    const absl::Time start = absl::Now();
    CHECK(remote.Calls(300, "lossy", absl::Seconds(20)) == 0);
    const auto after = Link(config_hosts, "stats");
    REQUIRE(after.ok());
    const int64_t lost = LinkCount(*after, "a>b", "lost") - LinkCount(*before, "a>b", "lost") +
                         LinkCount(*after, "b>a", "lost") - LinkCount(*before, "b>a", "lost");
    std::printf("loss %s: 300 calls in %s, %lld frames lost\n", loss,
                absl::FormatDuration(absl::Now() - start).c_str(), static_cast<long long>(lost));
    CHECK(lost > 0);  // the faults happened
  }
  const zrpc::ChannelStats stats = remote.channel->stats();
  CHECK(stats.connections_lost == 0);
}

TEST_CASE("the server's link down for 1 s: calls wait it out, none fails, the connection stays") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  Remote remote(config, config_hosts);
  REQUIRE(remote.Calls(20, "warm", absl::Seconds(10)) == 0);
  std::atomic<bool> calling{true};
  std::atomic<int> calls{0}, failed{0};
  absl::Duration longest;
  std::thread caller([&] {
    while (calling.load()) {
      const absl::Time start = absl::Now();
      failed += remote.Calls(1, "flap", absl::Seconds(10));
      longest = std::max(longest, absl::Now() - start);
      ++calls;
    }
  });
  absl::SleepFor(absl::Milliseconds(300));
  // Timed by the link, on the host: from in here the request to end it could come late.
  REQUIRE(Link(config_hosts, "down b for=1000").ok());
  const int at_down = calls.load();
  absl::SleepFor(absl::Seconds(3));
  calling = false;
  caller.join();
  std::printf("1 s link flap: %d calls (%d after it began), the longest %s, %d failed\n",
              calls.load(), calls.load() - at_down, absl::FormatDuration(longest).c_str(),
              failed.load());
  CHECK(failed.load() == 0);
  CHECK(longest >= absl::Milliseconds(500));  // a call waited through the flap
  CHECK(calls.load() > at_down + 5);          // and calls went on after it
  CHECK(remote.channel->stats().connections_lost == 0);
}

}  // namespace
