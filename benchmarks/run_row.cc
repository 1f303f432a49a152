#include "benchmarks/run_row.h"

#include <time.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zrpc::bench {

WorkloadResult MakeRow(const RunConfig& config, RunMeasurement run) {
  WorkloadResult row;
  row.system = config.system;
  row.workload = config.workload;
  row.size = config.size;
  row.in_flight = config.in_flight;
  row.threads = config.threads;
  row.connections = config.connections;
  row.round = config.round;
  row.calls = run.latencies_ns.size();
  row.seconds = absl::ToDoubleSeconds(run.elapsed);
  // Little's law: the calls in flight on average are the measured calls' latencies summed over
  // the time they took. A run that asked for a window and kept far less of it measured something
  // else than its row says (an issuing thread that woke late to refill freed slots, say: the time
  // a slot waits for it is in no call's latency), so the row says so.
  double latency_sum_ns = 0;
  for (int64_t ns : run.latencies_ns) latency_sum_ns += static_cast<double>(ns);
  const double mean_in_flight =
      row.seconds > 0 ? latency_sum_ns / 1e9 / row.seconds : static_cast<double>(config.in_flight);
  if (run.keeps_window && config.in_flight > 1 &&
      mean_in_flight < kKeptWindowShare * config.in_flight) {
    if (!run.note.empty()) run.note += "; ";
    run.note += absl::StrFormat("kept %.1f of %d calls in flight on average", mean_in_flight,
                                config.in_flight);
  }
  SetLatency(Summarize(std::move(run.latencies_ns)), row);
  row.calls_per_sec = row.calls / row.seconds;
  row.goodput_mib_per_sec = static_cast<double>(run.payload_bytes) / row.seconds / (1 << 20);
  row.client_cpu_us_per_call = run.client_cpu_ns / 1e3 / row.calls;
  row.server_cpu_us_per_call = run.server_cpu_ns < 0 ? -1 : run.server_cpu_ns / 1e3 / row.calls;
  row.note = std::move(run.note);
  return row;
}

std::string RowHeader() {
  return absl::StrFormat("%-6s %9s %6s %5s %10s %10s %10s %10s %10s %11s %10s %9s %9s\n", "work",
                         "size", "flight", "conn", "p50 us", "p90 us", "p99 us", "p99.9 us",
                         "max us", "calls/s", "MiB/s", "cli us/c", "srv us/c");
}

std::string FormatRow(const WorkloadResult& row) {
  return absl::StrFormat(
      "%-6s %9d %6d %5d %10.2f %10.2f %10.2f %10.2f %10.2f %11.0f %10.2f %9.2f %9.2f\n",
      row.workload, row.size, row.in_flight, row.connections, row.p50_us, row.p90_us, row.p99_us,
      row.p999_us, row.max_us, row.calls_per_sec, row.goodput_mib_per_sec,
      row.client_cpu_us_per_call, row.server_cpu_us_per_call);
}

uint64_t ProcessCpuNanos() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

absl::StatusOr<RowWriter> RowWriter::Open(const std::string& json_path) {
  RowWriter writer;
  if (!json_path.empty()) {
    writer.json_.open(json_path, std::ios::app);
    if (!writer.json_) {
      return absl::InvalidArgumentError(absl::StrCat("cannot open ", json_path, " for appending"));
    }
  }
  std::fputs(RowHeader().c_str(), stdout);
  return writer;
}

void RowWriter::Write(const WorkloadResult& row) {
  std::fputs(FormatRow(row).c_str(), stdout);
  std::fflush(stdout);
  if (!row.note.empty()) std::fprintf(stderr, "%s: %s\n", row.workload.c_str(), row.note.c_str());
  if (json_.is_open()) json_ << ToJsonLine(row) << std::flush;
}

}  // namespace zrpc::bench
