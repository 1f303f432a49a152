// Calls between two hosts over a link that misbehaves (tag "two_hosts": tools/test runs it in a
// `tools/softroce start --hosts 2` session). The server is rpc_peer in guest b; the channel is
// here, in guest a; tools/softroce-link on the host carries every frame between them and loses,
// or stops, what the test asks it to.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "rpc/channel.h"
#include "tests/hosts/two_hosts.h"
#include "transport/device.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::HelloReply;
using zrpc::examples::HelloRequest;
using zrpc::testing::Link;
using zrpc::testing::LinkCount;
using zrpc::testing::RemotePeer;
using zrpc::testing::Runfile;

struct CallRecord {
  absl::Time start;
  absl::Time end;
  absl::Status status;
};

// rpc_peer serving Greeter in guest b (saying "open N" as its open connections change), and a
// channel to it from here.
struct Remote {
  Remote(const zrpc::transport::DeviceConfig& config, const zrpc::testing::TwoHosts& hosts,
         zrpc::ChannelOptions options = {})
      : server(hosts, {Runfile("tests/rpc/rpc_peer"), "server", "0", "report"}) {
    const std::string line = server.ReadLine(absl::Seconds(60));
    INFO("rpc_peer in guest b said: \"" << line << "\"");
    int port = 0;
    REQUIRE(std::sscanf(line.c_str(), "listening %d", &port) == 1);
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

  // One call with `deadline`, timed.
  CallRecord Timed(const std::string& name, absl::Duration deadline) {
    HelloRequest request;
    request.set_name(name);
    HelloReply reply;
    zrpc::CallOptions call;
    CallRecord record;
    record.start = absl::Now();
    call.deadline = record.start + deadline;
    record.status = stub->SayHello(request, &reply, call);
    record.end = absl::Now();
    if (record.status.ok() && reply.message() != "Hello, " + name) {
      record.status = absl::DataLossError(reply.message());
    }
    return record;
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

// Threads that call one after another until stopped, each call timed. A failed REQUIRE unwinds
// through the destructor, which stops and joins them. Catch is told nothing from these threads:
// the records are read once they have stopped.
class Callers {
 public:
  Callers(int threads, std::function<CallRecord()> call) : records_(threads) {
    for (std::vector<CallRecord>& mine : records_) {
      threads_.emplace_back([this, &mine, call] {
        while (running_.load()) {
          mine.push_back(call());
          calls_.fetch_add(1);
        }
      });
    }
  }
  ~Callers() { Stop(); }

  int calls() const { return calls_.load(); }
  // Every call of every thread, once they have stopped.
  std::vector<CallRecord> Stop() {
    running_ = false;
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
    std::vector<CallRecord> all;
    for (const auto& mine : records_) all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }

 private:
  std::atomic<bool> running_{true};
  std::atomic<int> calls_{0};
  std::vector<std::vector<CallRecord>> records_;
  std::vector<std::thread> threads_;
};

// Clears the link's faults when a test case ends, however it ends.
struct CleanLink {
  explicit CleanLink(const zrpc::testing::TwoHosts& hosts) : hosts(hosts) {}
  ~CleanLink() {
    (void)Link(hosts, "faults both none");
    (void)Link(hosts, "up b");
    (void)Link(hosts, "up a");
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
  Callers callers(1, [&] { return remote.Timed("flap", absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(300));
  // Timed by the link, on the host: from in here the request to end it could come late.
  REQUIRE(Link(config_hosts, "down b for=1000").ok());
  const int at_down = callers.calls();
  absl::SleepFor(absl::Seconds(3));
  const std::vector<CallRecord> records = callers.Stop();
  int failed = 0;
  absl::Duration longest;
  for (const CallRecord& r : records) {
    longest = std::max(longest, r.end - r.start);
    if (!r.status.ok()) {
      UNSCOPED_INFO(r.status);
      ++failed;
    }
  }
  std::printf("1 s link flap: %zu calls (%zu after it began), the longest %s, %d failed\n",
              records.size(), records.size() - at_down, absl::FormatDuration(longest).c_str(),
              failed);
  CHECK(failed == 0);
  CHECK(longest >= absl::Milliseconds(500));                 // a call waited through the flap
  CHECK(records.size() > static_cast<size_t>(at_down) + 5);  // and calls went on after it
  CHECK(remote.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "this host's link down for 1 s: its device reports the port down and active again (read from "
    "its event file), and the connection survives") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  Remote remote(config, config_hosts);
  REQUIRE(remote.Calls(5, "warm", absl::Seconds(10)) == 0);
  // Every Device on the context shares its one reader of events (async_events.h): this one
  // counts what the channel's reads.
  auto device = zrpc::transport::Device::Open(config);
  INFO(device.status());
  REQUIRE(device.ok());
  const zrpc::transport::AsyncEventCounts before = (*device)->async_events();
  REQUIRE(Link(config_hosts, "down a for=1000").ok());
  zrpc::transport::AsyncEventCounts after;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  do {
    absl::SleepFor(absl::Milliseconds(100));
    after = (*device)->async_events();
  } while ((after.port_down == before.port_down || after.port_active == before.port_active) &&
           absl::Now() < until);
  std::printf("guest a's link down for 1 s: %llu port-down and %llu port-active events read\n",
              static_cast<unsigned long long>(after.port_down - before.port_down),
              static_cast<unsigned long long>(after.port_active - before.port_active));
  CHECK(after.port_down > before.port_down);
  CHECK(after.port_active > before.port_active);
  CHECK(after.queue_pair_errors == before.queue_pair_errors);
  CHECK(remote.Calls(5, "after", absl::Seconds(10)) == 0);
  CHECK(remote.channel->stats().connections_lost == 0);
}

TEST_CASE(
    "the server's link down for 10 s: calls fail at their deadlines, and the channel is back "
    "within 2 s of the link's return") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  // Reconnection backs off at most 1 s here (the default, 5 s, can leave a channel that failed
  // attempts all through the outage waiting that long after the link is back: docs/guide.md).
  zrpc::ChannelOptions options;
  options.reconnect_backoff_max = absl::Seconds(1);
  Remote remote(config, config_hosts, options);
  REQUIRE(remote.Calls(20, "warm", absl::Seconds(10)) == 0);
  constexpr absl::Duration kDeadline = absl::Seconds(1);
  Callers callers(1, [&] { return remote.Timed("outage", kDeadline); });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time asked = absl::Now();
  REQUIRE(Link(config_hosts, "down b for=10000").ok());
  const absl::Time answered = absl::Now();
  // The link is back between asked + 10 s and answered + 10 s (the link times it): measuring
  // from the earlier makes the recovery look slower, never faster.
  const absl::Time back = asked + absl::Seconds(10);
  absl::SleepFor(answered + absl::Seconds(14) - absl::Now());
  const std::vector<CallRecord> records = callers.Stop();
  int failed = 0, late = 0;
  absl::Time first_after = absl::InfiniteFuture();
  absl::Duration longest;
  for (const CallRecord& r : records) {
    longest = std::max(longest, r.end - r.start);
    if (r.end - r.start > kDeadline + absl::Milliseconds(200)) ++late;
    if (!r.status.ok()) {
      ++failed;
      INFO(r.status);
      CHECK((r.status.code() == absl::StatusCode::kDeadlineExceeded ||
             r.status.code() == absl::StatusCode::kUnavailable));
    } else if (r.end >= back && first_after == absl::InfiniteFuture()) {
      first_after = r.end;
    }
  }
  std::printf(
      "link down 10 s: %zu calls, %d failed, the longest %s; the first success %s after the "
      "link's return (its request took %s)\n",
      records.size(), failed, absl::FormatDuration(longest).c_str(),
      absl::FormatDuration(first_after - back).c_str(),
      absl::FormatDuration(answered - asked).c_str());
  CHECK(failed > 0);  // the outage was seen
  CHECK(late == 0);   // every call ended by its deadline (200 ms for the timer and the guest)
  CHECK(first_after - back <= absl::Seconds(2));
}

TEST_CASE("a one-way partition: both sides declare the connection dead within 3 s") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  // Each direction black-holed in turn, under calls the server answers at once: when frames
  // toward it are lost, it may have nothing unacknowledged left to fail, and must find the break
  // by probing the client that went quiet.
  for (const char* direction : {"a>b", "b>a"}) {
    INFO("frames " << direction << " lost");
    Remote remote(config, config_hosts);
    REQUIRE(remote.Calls(20, "warm", absl::Seconds(10)) == 0);
    // This side gives the connection up when the channel counts it lost: watched from its own
    // thread, while this one reads what the server says.
    std::atomic<int64_t> client_gone_ns{0};
    std::atomic<bool> watching{true};
    std::thread watcher([&] {
      while (watching.load() && remote.channel->stats().connections_lost == 0) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      if (watching.load()) client_gone_ns = absl::ToUnixNanos(absl::Now());
    });
    Callers callers(2, [&] { return remote.Timed("partition", absl::Seconds(10)); });
    absl::SleepFor(absl::Milliseconds(500));
    const absl::Time asked = absl::Now();
    const absl::Status faulted =
        Link(config_hosts, absl::StrCat("faults ", direction, " loss=1")).status();
    const absl::Time answered = absl::Now();
    // The server's side: its log line saying the connection failed, or its count of connections
    // closed reaching 1 (the client may give up first and its disconnect reach the server, which
    // says nothing of a peer that closed; its count of open connections says nothing either, as
    // the client's next attempt takes the place at once, and its handshake fails seconds
    // later). It reaches this guest through the harness (a tenth of a second or so), which
    // counts against it. Bounded as a whole: a client trying to reconnect keeps the server
    // talking.
    std::string line, server_said, server_lines;
    absl::Time server_gone = absl::InfiniteFuture();
    for (const absl::Time give_up = asked + absl::Seconds(10);
         faulted.ok() && absl::Now() < give_up &&
         !(line = remote.server.ReadLine(give_up - absl::Now())).empty();) {
      absl::StrAppend(&server_lines, "\n  ", absl::FormatDuration(absl::Now() - asked), ": ", line);
      if ((absl::StartsWith(line, "log server: the connection to ") &&
           absl::StrContains(line, " failed: ")) ||
          line == "closed 1") {
        server_gone = absl::Now();
        server_said = line;
        break;
      }
    }
    for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
         client_gone_ns.load() == 0 && absl::Now() < give_up;) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    watching = false;
    watcher.join();
    const absl::Time client_gone = client_gone_ns.load() != 0
                                       ? absl::FromUnixNanos(client_gone_ns.load())
                                       : absl::InfiniteFuture();
    const std::vector<CallRecord> records = callers.Stop();
    // Every call that failed ends within 3 s of the break when it was in flight then (one in
    // flight when a>b broke may still have been answered), or within its connection attempt
    // (connect_timeout, 3 s) when it began later: some begun after the break waited on the
    // broken connection, the rest tried a new one.
    int cut = 0, slow = 0;
    absl::Duration slowest;
    for (const CallRecord& r : records) {
      if (r.status.ok() || r.end < asked) continue;
      INFO(r.status);
      CHECK(r.status.code() == absl::StatusCode::kUnavailable);
      if (r.start < client_gone) ++cut;
      if (r.start < answered) {
        slowest = std::max(slowest, r.end - asked);
        if (r.end - asked > absl::Seconds(3)) ++slow;
      } else if (r.end - r.start > absl::Milliseconds(3200)) {
        ++slow;
      }
    }
    std::printf(
        "%s black-holed: the server gave the connection up %s after the break was asked for "
        "(\"%s\"), the client %s (the request took %s); %d calls failed with it, those in "
        "flight the last %s after\n",
        direction, absl::FormatDuration(server_gone - asked).c_str(), server_said.c_str(),
        absl::FormatDuration(client_gone - asked).c_str(),
        absl::FormatDuration(answered - asked).c_str(), cut, absl::FormatDuration(slowest).c_str());
    REQUIRE(faulted.ok());
    INFO("what the server said after the break was asked for:" << server_lines);
    CHECK(server_gone - asked <= absl::Seconds(3));
    CHECK(client_gone - asked <= absl::Seconds(3));
    CHECK(cut >= 1);
    CHECK(slow == 0);
    REQUIRE(Link(config_hosts, "faults both none").ok());
  }
}

TEST_CASE(
    "the server restarted under 100 clients: every one reconnects, none past the server's "
    "count") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  constexpr int kClients = 100;
  auto server = std::make_unique<RemotePeer>(
      config_hosts,
      std::vector<std::string>{Runfile("tests/rpc/rpc_peer"), "server", "0", "report"});
  int port = 0;
  REQUIRE(std::sscanf(server->ReadLine(absl::Seconds(60)).c_str(), "listening %d", &port) == 1);
  // A hundred channels, one connection each, sharing one poller group (a guest's one vCPU).
  std::vector<std::unique_ptr<zrpc::ClientChannel>> clients;
  std::vector<std::unique_ptr<Greeter::Stub>> stubs;
  zrpc::ChannelOptions options;
  options.device = config;
  options.poller_group = "clients";
  options.reconnect_backoff_max = absl::Seconds(1);
  for (int i = 0; i < kClients; ++i) {
    auto channel = zrpc::CreateChannel(absl::StrCat(config_hosts.peer_addr, ":", port), options);
    INFO(channel.status());
    REQUIRE(channel.ok());
    clients.push_back(*std::move(channel));
    stubs.push_back(std::make_unique<Greeter::Stub>(clients.back().get()));
  }
  // One call on each: a connection each, reached by a call.
  auto call_all = [&](absl::Time give_up) {
    int answered = 0;
    for (int i = 0; i < kClients; ++i) {
      for (;;) {
        HelloRequest request;
        request.set_name("again");
        HelloReply reply;
        zrpc::CallOptions call;
        call.deadline = give_up;
        const absl::Status s = stubs[i]->SayHello(request, &reply, call);
        if (s.ok()) {
          ++answered;
          break;
        }
        if (absl::Now() >= give_up) break;
        absl::SleepFor(absl::Milliseconds(50));  // backing off; the next attempt comes
      }
    }
    return answered;
  };
  REQUIRE(call_all(absl::Now() + absl::Seconds(60)) == kClients);
  uint64_t lost_before = 0;
  for (const auto& client : clients) lost_before += client->stats().connections_lost;

  // The server goes (its kernel tells every client) and comes back on the same port.
  server.reset();
  const absl::Time stopped = absl::Now();
  server = std::make_unique<RemotePeer>(
      config_hosts, std::vector<std::string>{Runfile("tests/rpc/rpc_peer"), "server",
                                             absl::StrCat(port), "report"});
  const std::string listening = server->ReadLine(absl::Seconds(60));
  INFO("the new server said: " << listening);
  REQUIRE(listening == absl::StrCat("listening ", port));
  const absl::Time started = absl::Now();
  const int answered = call_all(started + absl::Seconds(60));
  const absl::Time all_back = absl::Now();
  // The server's count of open connections (handshakes included) as it moved, and the most it
  // held at once (its admission count's peak, ServerStats::connections_peak).
  int most = 0, last = -1;
  for (std::string line; !(line = server->ReadLine(absl::Seconds(1))).empty();) {
    int n = 0;
    if (std::sscanf(line.c_str(), "open %d", &n) == 1) last = n;
    if (std::sscanf(line.c_str(), "peak %d", &n) == 1) most = std::max(most, n);
  }
  uint64_t lost = 0;
  for (const auto& client : clients) lost += client->stats().connections_lost;
  std::printf(
      "server restarted under %d clients: it was back %s after it was stopped; all %d answered "
      "%s after that; the server held at most %d connections, %d at the end; %llu connections "
      "lost\n",
      kClients, absl::FormatDuration(started - stopped).c_str(), answered,
      absl::FormatDuration(all_back - started).c_str(), most, last,
      static_cast<unsigned long long>(lost - lost_before));
  CHECK(answered == kClients);
  CHECK(last == kClients);                // one connection each, no leftovers
  CHECK(most <= kClients);                // never more at once: no client made two
  CHECK(lost - lost_before == kClients);  // each lost its connection once, when the server went
}

TEST_CASE("the server's host killed mid-traffic: every call on it ends within min(deadline, 3 s)") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  CleanLink clean(config_hosts);
  {
    Remote remote(config, config_hosts);
    REQUIRE(remote.Calls(20, "warm", absl::Seconds(10)) == 0);
    // Four callers, each with calls of a 10 s deadline one after another (the server sleeps
    // 50 ms in each, so calls are in flight when the host goes).
    Callers callers(4, [&] { return remote.Timed("sleep:50", absl::Seconds(10)); });
    absl::SleepFor(absl::Milliseconds(500));
    const absl::Time asked = absl::Now();
    REQUIRE(Link(config_hosts, "kill b").ok());
    const absl::Time answered = absl::Now();
    absl::SleepFor(absl::Seconds(5));
    const std::vector<CallRecord> records = callers.Stop();
    // The host went between asked and answered. The calls in flight then end within 3 s of it
    // (measured from asked: the check is the stricter for it); those started afterwards fail as
    // their connect attempt does (connect_timeout, 3 s).
    int cut = 0, later = 0, slow = 0;
    absl::Duration slowest;
    for (const CallRecord& r : records) {
      if (r.end < asked || r.status.ok()) continue;  // answered before the host went
      INFO(r.status);
      CHECK(r.status.code() == absl::StatusCode::kUnavailable);
      if (r.start < answered) {
        ++cut;
        slowest = std::max(slowest, r.end - asked);
        if (r.end - asked > absl::Seconds(3)) ++slow;
      } else {
        ++later;
        if (r.end - r.start > absl::Milliseconds(3200)) ++slow;
      }
    }
    std::printf(
        "host killed: %d calls in flight failed, the last %s after the kill was asked for (the "
        "request took %s); %d calls after it failed too\n",
        cut, absl::FormatDuration(slowest).c_str(), absl::FormatDuration(answered - asked).c_str(),
        later);
    CHECK(cut >= 4);  // every caller had one in flight
    CHECK(slow == 0);
  }
  // The next test case has a guest b again.
  const auto revived = Link(config_hosts, "revive b");
  INFO(revived.status());
  CHECK(revived.ok());
}

}  // namespace
