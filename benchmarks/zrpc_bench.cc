// zrpc_bench: zrpc's RPCs measured, server and client in one binary (see bench_args.h for the
// command line). The server serves the Bench service (bench.proto) with every method inline on
// busy-polling pollers, as a latency-minded deployment would (--pool-handlers puts them on the
// handler pool, the default users get, and --event the pollers in event mode); the client runs
// closed-loop workloads (bench_client.h), prints a row per run and appends it to --json as JSON
// Lines (report.h), which bench_report merges with gRPC's and perftest's rows.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/bench_args.h"
#include "benchmarks/bench_client.h"
#include "benchmarks/bench_service.h"
#include "benchmarks/report.h"
#include "benchmarks/run_row.h"
#include "benchmarks/stop_signal.h"
#include "rpc/channel.h"
#include "rpc/server.h"

namespace zrpc::bench {
namespace {

// Large enough for a 4 KiB echo payload and its headers.
constexpr size_t kSlotSize = 8192;

uint32_t ArenaFor(uint64_t payload) {
  // The arena must hold a payload and be a multiple of 64; keep at least the default.
  uint64_t arena = std::max<uint64_t>(payload, 256 << 10);
  return static_cast<uint32_t>((arena + 63) / 64 * 64);
}

int Serve(const BenchArgs& args) {
  const StopSignal stop;  // before any thread starts
  ServerOptions options;
  options.port = 7471;
  if (!args.listen.empty()) {
    absl::StatusOr<examples::cli::HostPort> listen = ParseAddress("--listen", args.listen, false);
    if (!listen.ok()) {
      std::fprintf(stderr, "zrpc_bench: %s\n%s", std::string(listen.status().message()).c_str(),
                   kBenchUsage);
      return 2;
    }
    options.address = listen->address;
    options.port = listen->port;
  }
  options.pollers = args.pollers;
  // The pollers asked for, none added; their shared receive queues (the server's default) within
  // half the slot pool's cap however many there are: 4096 each up to 16 pollers, fewer past.
  options.max_pollers = args.pollers;
  options.shared_receive_queue =
      std::min<uint32_t>(options.shared_receive_queue, 65536 / std::max(args.pollers, 1));
  // A benchmark's clients are usually one host: it may take what the pollers hold, less the half
  // kept from any one address (ServerOptions::listener).
  options.listener.max_connections_per_peer = options.listener.max_connections;
  options.poll_mode = args.event ? transport::PollMode::kEvent : transport::PollMode::kBusy;
  if (args.spin) options.spin = *args.spin;
  options.inline_by_default = !args.pool_handlers;
  options.slots.slot_size = kSlotSize;
  options.listener.connection.arena_size =
      args.arena != 0 ? static_cast<uint32_t>(args.arena) : ArenaFor(args.max_bulk);
  options.staging_bytes = std::max<size_t>(size_t{64} << 20, 4 * args.max_bulk);
  BenchService service(args.max_bulk);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  absl::Status s = server.ok() ? (*server)->AddService(&service) : server.status();
  if (s.ok()) s = (*server)->Start();
  if (!s.ok()) {
    std::fprintf(stderr, "zrpc_bench server: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("listening %s:%u\n", (*server)->address().c_str(), (*server)->port());
  std::fflush(stdout);
  stop.Wait();
  (*server)->Shutdown(absl::Seconds(2));
  return 0;
}

int Client(const BenchArgs& args) {
  const uint64_t largest = *std::max_element(args.sizes.begin(), args.sizes.end());
  if (args.workload == Workload::kEcho && largest > MaxEchoPayload(kSlotSize)) {
    std::fprintf(stderr, "zrpc_bench: an echo payload is at most %llu bytes here\n",
                 static_cast<unsigned long long>(MaxEchoPayload(kSlotSize)));
    return 2;
  }
  absl::StatusOr<RowWriter> rows = RowWriter::Open(args.json);
  if (!rows.ok()) {
    std::fprintf(stderr, "zrpc_bench: %s\n", std::string(rows.status().message()).c_str());
    return 1;
  }
  for (int connections : args.connections) {
    ChannelOptions options;
    options.connections = connections;
    options.pollers = std::min(connections, args.pollers);
    options.poll_mode = args.event ? transport::PollMode::kEvent : transport::PollMode::kBusy;
    if (args.spin) options.spin = *args.spin;
    options.slots.slot_size = kSlotSize;
    options.connection.arena_size = ArenaFor(args.workload == Workload::kGet ? largest : 0);
    options.staging_bytes = std::max<size_t>(size_t{64} << 20, 4 * largest);
    // A stream's window is the channel's (bench_args.h): one --in-flight for stream.
    if (args.workload == Workload::kStream) {
      options.stream_window = static_cast<uint16_t>(args.in_flight.front());
    }
    absl::StatusOr<std::unique_ptr<ClientChannel>> channel = CreateChannel(args.connect, options);
    absl::Status s =
        // A thousand connections take tens of seconds in the emulated guest, 16 at a time
        // (ClientChannel::Connect): 30 s, and 50 ms more for each.
        channel.ok() ? (*channel)->Connect(absl::Now() + absl::Seconds(30) +
                                           connections * absl::Milliseconds(50))
                     : channel.status();
    if (!s.ok()) {
      std::fprintf(stderr, "zrpc_bench client: %s\n", s.ToString().c_str());
      return 1;
    }
    for (uint64_t size : args.sizes) {
      for (int in_flight : args.in_flight) {
        if (args.max_bytes_in_flight != 0 && size * in_flight > args.max_bytes_in_flight) {
          std::printf("%-6s %9llu %6d %5d  skipped: %llu bytes in flight pass the sweep's %llu\n",
                      WorkloadName(args.workload), static_cast<unsigned long long>(size), in_flight,
                      connections, static_cast<unsigned long long>(size * in_flight),
                      static_cast<unsigned long long>(args.max_bytes_in_flight));
          continue;
        }
        RunSpec spec;
        spec.workload = args.workload;
        spec.size = size;
        spec.in_flight = in_flight;
        spec.threads = args.threads;
        spec.calls = args.calls;
        spec.duration = args.duration;
        spec.warmup = args.warmup;
        spec.registered = args.registered;
        spec.blocking = args.blocking;
        absl::StatusOr<RunMeasurement> run = RunWorkload(**channel, spec);
        if (!run.ok()) {
          std::fprintf(stderr, "zrpc_bench client: %s %llu B x%d: %s\n",
                       WorkloadName(args.workload), static_cast<unsigned long long>(size),
                       in_flight, run.status().ToString().c_str());
          return 1;
        }
        // Rows of an event-mode client (ChannelOptions::poll_mode kEvent, the default users
        // get) are their own workload: "echo_event" beside busy-polled "echo", and
        // "echo_event_spin0us" for another spin than the default.
        const std::string workload = RowWorkload(args, ChannelOptions().spin);
        rows->Write(
            MakeRow({"zrpc", workload, size, in_flight, args.threads, connections, args.round},
                    *std::move(run)));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace zrpc::bench

int main(int argc, char** argv) {
  return zrpc::bench::BenchMain("zrpc_bench", zrpc::bench::kBenchUsage, argc, argv, nullptr,
                                zrpc::bench::Serve, zrpc::bench::Client);
}
