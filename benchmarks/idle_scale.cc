// idle_scale: what idle connections cost a server, and what they do to an active one beside them
// (issue 35's measurements; benchmarks/idle_scale.sh runs the roles in the guest and prints the
// table). Three roles, each a process of its own so that each side's pinned memory is its own:
//
//   idle_scale server [--port P] [--pollers N] [--shared-receive-queue R] [--arena-pool N]
//                     [--window W] [--arena BYTES] [--max-slots N] [--keepalive-budget N]
//     Serves the Bench service with default ServerOptions but for the flags given (--pollers N:
//     N pollers, none added) and the admission limit per address (raised: every client of a
//     one-guest run has the guest's one address). --max-slots sets the registered slot pool's bound
//     (SlotPoolOptions::max_slots, 131,072), which shared receive queues of many pollers may need;
//     --keepalive-budget the pings a second it asks its idle clients to keep to, all together
//     (ServerOptions::idle_keepalive_budget, 20).
//     Prints "status open=N pinned_kib=K pollers=P keepalives=A idle_probes=B" every second:
//     connections open, the process's pinned memory (VmPin, transport/process_limits.h), its
//     pollers, and the pings it answered and idle connections it probed since it started.
//   idle_scale idle --connect A:P --connections N [--per-channel C] [--shared-receive-queue R]
//                   [--arena-pool N] [--window W] [--arena BYTES] [--idle-keepalive SECONDS]
//     Holds N connections, idle (channels of up to C each, 1,000 by default, default options but
//     for the flags; with C below 1,000 the channels share one poller group, as a client with a
//     channel to each of many servers would: what fan-out costs per connection;
//     --shared-receive-queue R > 0: a queue that backs exactly the channel's windows;
//     --idle-keepalive: ChannelOptions::idle_keepalive_interval, 0 for no idle checks), until
//     SIGTERM. Prints "idle connected=N seconds=S pinned_kib=K" once they are up,
//     then "idle lost=L pings=N pings_failed=F ping_p99_ms=X" at the end (the keepalive
//     probes of the whole run; exit status 1 when a connection was lost or a probe failed).
//   idle_scale active --connect A:P [--seconds S]
//     One connection with default ChannelOptions (event mode), 64-byte echoes one at a time for
//     S seconds (after 1,000 unmeasured): prints "active calls_per_sec=X p50_us=Y p99_us=Z".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_client.h"
#include "benchmarks/bench_service.h"
#include "benchmarks/report.h"
#include "benchmarks/run_row.h"
#include "examples/cli.h"
#include "rpc/channel.h"
#include "rpc/metrics.h"
#include "rpc/server.h"
#include "transport/process_limits.h"

namespace zrpc::bench {
namespace {

namespace cli = zrpc::examples::cli;

constexpr char kUsage[] =
    "usage: idle_scale server [--port P] [--pollers N] [--shared-receive-queue R] "
    "[--arena-pool N] [--window W] [--arena BYTES] [--max-slots N] [--keepalive-budget N]\n"
    "       idle_scale idle --connect A:P --connections N [--per-channel C] "
    "[--shared-receive-queue R] "
    "[--arena-pool N] [--window W] [--arena BYTES] [--idle-keepalive SECONDS]\n"
    "       idle_scale active --connect A:P [--seconds S]\n";

constexpr int kPerChannel = 1000;

uint64_t PinnedKiB() { return transport::PinnedBytes() >> 10; }

// The flags every role may take, checked.
struct Flags {
  uint16_t port = 7472;
  std::optional<int> pollers;  // unset: the side's default
  std::optional<uint32_t> shared_receive_queue;
  std::optional<uint32_t> arena_pool;
  uint32_t window = 0;  // 0: the default recv_credits
  std::optional<uint32_t> arena;
  std::string connect;
  int connections = 0;
  int per_channel = kPerChannel;
  int seconds = 10;
  uint32_t max_slots = 0;  // 0: the pool's default
  std::optional<uint32_t> keepalive_budget;
  std::optional<uint32_t> idle_keepalive_seconds;
};

// Applies the flags that shape a connection's registered memory to a side's options.
template <typename Options>
void Shape(const Flags& flags, Options& options, transport::ConnectionOptions& connection) {
  if (flags.shared_receive_queue) options.shared_receive_queue = *flags.shared_receive_queue;
  if (flags.arena_pool) options.arena_pool = *flags.arena_pool;
  if (flags.window != 0) connection.recv_credits = flags.window;
  if (flags.arena) connection.arena_size = *flags.arena;
}

int Serve(const Flags& flags) {
  const sigset_t stop = cli::BlockStopSignals();
  ServerOptions options;
  options.port = flags.port;
  if (flags.pollers) {
    options.pollers = *flags.pollers;
    options.max_pollers = *flags.pollers;  // the pollers asked for, none added
  }
  if (flags.max_slots != 0) options.slots.max_slots = flags.max_slots;
  if (flags.keepalive_budget) options.idle_keepalive_budget = *flags.keepalive_budget;
  Shape(flags, options, options.listener.connection);
  // The one admission option a one-guest run changes: every place may go to one address (it
  // stands when the pollers hold max_connections; else the server halves it).
  options.listener.max_connections_per_peer = options.listener.max_connections;
  BenchService service(4096);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  absl::Status s = server.ok() ? (*server)->AddService(&service) : server.status();
  if (s.ok()) s = (*server)->Start();
  if (!s.ok()) {
    std::fprintf(stderr, "idle_scale server: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("listening %s:%u\n", (*server)->address().c_str(), (*server)->port());
  std::fflush(stdout);
  absl::Notification done;
  std::thread status([&] {
    while (!done.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      const ServerStats stats = (*server)->stats();
      std::printf(
          "status open=%llu pinned_kib=%llu pollers=%llu keepalives=%llu idle_probes=%llu\n",
          static_cast<unsigned long long>(stats.connections_open),
          static_cast<unsigned long long>(PinnedKiB()),
          static_cast<unsigned long long>(stats.pollers),
          static_cast<unsigned long long>(stats.keepalives_answered),
          static_cast<unsigned long long>(stats.idle_probes));
      std::fflush(stdout);
    }
  });
  cli::WaitForStopSignal(stop);
  done.Notify();
  status.join();
  (*server)->Shutdown(absl::Seconds(2));
  return 0;
}

int Idle(const Flags& flags) {
  const sigset_t stop = cli::BlockStopSignals();
  std::vector<std::unique_ptr<ClientChannel>> channels;
  const absl::Time start = absl::Now();
  for (int left = flags.connections; left > 0; left -= flags.per_channel) {
    ChannelOptions options;
    options.connections = std::min(left, flags.per_channel);
    // Fan-out: many channels on one group's pollers (sized as a server's), not a poller each.
    if (flags.per_channel < kPerChannel) options.poller_group = "idle_scale";
    options.connect_timeout = absl::Seconds(30);
    Shape(flags, options, options.connection);
    if (flags.idle_keepalive_seconds) {
      options.idle_keepalive_interval = absl::Seconds(*flags.idle_keepalive_seconds);
    }
    // A client's queue backs exactly its channel's windows (the server's may back many more).
    if (flags.shared_receive_queue.value_or(0) != 0 && options.poller_group.empty()) {
      options.shared_receive_queue = options.connections * options.connection.recv_credits;
    }
    absl::StatusOr<std::unique_ptr<ClientChannel>> channel = CreateChannel(flags.connect, options);
    absl::Status s =
        channel.ok() ? (*channel)->Connect(absl::Now() + absl::Minutes(5)) : channel.status();
    if (!s.ok()) {
      std::fprintf(stderr, "idle_scale idle: after %zu channels: %s\n", channels.size(),
                   s.ToString().c_str());
      return 1;
    }
    channels.push_back(std::move(*channel));
  }
  std::printf("idle connected=%d channels=%zu seconds=%.1f pinned_kib=%llu\n", flags.connections,
              channels.size(), absl::ToDoubleSeconds(absl::Now() - start),
              static_cast<unsigned long long>(PinnedKiB()));
  std::fflush(stdout);
  cli::WaitForStopSignal(stop);
  uint64_t lost = 0;
  uint64_t pings = 0;
  uint64_t failed = 0;
  LatencySnapshot latency;
  for (const auto& channel : channels) {
    lost += channel->stats().connections_lost;
    for (const MethodMetricsSnapshot& m : channel->metrics().Snapshot()) {
      if (m.method != "zrpc.Keepalive/Ping") continue;
      pings += m.started;
      failed += m.finished_total - m.finished[0];
      latency.Add(m.latency);
    }
  }
  // The keepalive probes' latency over the whole run (rpc/client/keepalive.h), its target below
  // half the 2 s keepalive_timeout.
  std::printf("idle lost=%llu pings=%llu pings_failed=%llu ping_p99_ms=%.1f\n",
              static_cast<unsigned long long>(lost), static_cast<unsigned long long>(pings),
              static_cast<unsigned long long>(failed), latency.Percentile(0.99) * 1e3);
  std::fflush(stdout);
  return lost == 0 && failed == 0 ? 0 : 1;
}

int Active(const Flags& flags) {
  ChannelOptions options;
  absl::StatusOr<std::unique_ptr<ClientChannel>> channel = CreateChannel(flags.connect, options);
  absl::Status s =
      channel.ok() ? (*channel)->Connect(absl::Now() + absl::Seconds(30)) : channel.status();
  if (!s.ok()) {
    std::fprintf(stderr, "idle_scale active: %s\n", s.ToString().c_str());
    return 1;
  }
  RunSpec spec;
  spec.workload = Workload::kEcho;
  spec.size = 64;
  spec.duration = absl::Seconds(flags.seconds);
  absl::StatusOr<RunMeasurement> run = RunWorkload(**channel, spec);
  if (!run.ok()) {
    std::fprintf(stderr, "idle_scale active: %s\n", run.status().ToString().c_str());
    return 1;
  }
  const size_t calls = run->latencies_ns.size();
  const Summary summary = Summarize(std::move(run->latencies_ns));
  std::printf("active calls_per_sec=%.0f p50_us=%.1f p99_us=%.1f\n",
              static_cast<double>(calls) / absl::ToDoubleSeconds(run->elapsed),
              summary.p50_nanos / 1e3, summary.p99_nanos / 1e3);
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string role = argv[1];
  cli::CommandLine args("idle_scale", kUsage);
  if (!args.Parse(argc - 1, argv + 1,
                  {"port", "pollers", "shared-receive-queue", "arena-pool", "window", "arena",
                   "connect", "connections", "per-channel", "seconds", "max-slots",
                   "keepalive-budget", "idle-keepalive"})) {
    return args.exit_code();
  }
  Flags flags;
  struct Number {
    const char* name;
    uint64_t min, max;
    std::function<void(uint64_t)> set;
  };
  const Number numbers[] = {
      {"port", 1, 65535, [&](uint64_t v) { flags.port = static_cast<uint16_t>(v); }},
      {"pollers", 1, 64, [&](uint64_t v) { flags.pollers = static_cast<int>(v); }},
      {"shared-receive-queue", 0, 1 << 20,
       [&](uint64_t v) { flags.shared_receive_queue = static_cast<uint32_t>(v); }},
      {"arena-pool", 0, 1 << 16, [&](uint64_t v) { flags.arena_pool = static_cast<uint32_t>(v); }},
      {"window", 4, 1024, [&](uint64_t v) { flags.window = static_cast<uint32_t>(v); }},
      {"connections", 1, 100000, [&](uint64_t v) { flags.connections = static_cast<int>(v); }},
      {"per-channel", 1, kPerChannel, [&](uint64_t v) { flags.per_channel = static_cast<int>(v); }},
      {"seconds", 1, 3600, [&](uint64_t v) { flags.seconds = static_cast<int>(v); }},
      {"max-slots", 1, 1 << 24, [&](uint64_t v) { flags.max_slots = static_cast<uint32_t>(v); }},
      {"keepalive-budget", 0, 100000,
       [&](uint64_t v) { flags.keepalive_budget = static_cast<uint32_t>(v); }},
      {"idle-keepalive", 0, 3600,
       [&](uint64_t v) { flags.idle_keepalive_seconds = static_cast<uint32_t>(v); }},
  };
  for (const Number& n : numbers) {
    const std::string* text = args.Find(n.name);
    if (text == nullptr) continue;
    const std::optional<uint64_t> value = cli::ParseNumber(*text, n.min, n.max);
    if (!value) {
      return args.UsageError(absl::StrCat("--", n.name, " ", *text, ": expected a number in [",
                                          n.min, ", ", n.max, "]"));
    }
    n.set(*value);
  }
  if (const std::string* text = args.Find("arena")) {
    const std::optional<uint64_t> value = cli::ParseBytes(*text, 0, uint64_t{1} << 30);
    if (!value) return args.UsageError(absl::StrCat("--arena ", *text, ": expected a size"));
    flags.arena = static_cast<uint32_t>(*value);
  }
  if (const std::string* text = args.Find("connect")) flags.connect = *text;
  if (role == "server") return Serve(flags);
  if (flags.connect.empty() || !cli::IsTarget(flags.connect)) {
    return args.UsageError("--connect ADDRESS:PORT is needed");
  }
  if (role == "idle") {
    if (flags.connections == 0) return args.UsageError("--connections N is needed");
    return Idle(flags);
  }
  if (role == "active") return Active(flags);
  return args.UsageError(absl::StrCat("unknown role '", role, "'"));
}

}  // namespace
}  // namespace zrpc::bench

int main(int argc, char** argv) { return zrpc::bench::Main(argc, argv); }
