// One closed-loop run's raw measurement, and the row (report.h's WorkloadResult) it becomes:
// shared by zrpc_bench, transport_bench and grpc_bench so that every system's figures are derived,
// and printed, the same way.
#ifndef ZRPC_BENCHMARKS_RUN_ROW_H_
#define ZRPC_BENCHMARKS_RUN_ROW_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "benchmarks/report.h"

namespace zrpc::bench {

struct RunMeasurement {
  std::vector<int64_t> latencies_ns;  // one per measured call, in no particular order
  absl::Duration elapsed;
  uint64_t payload_bytes = 0;  // payload moved by measured calls (both ways for echo)
  double client_cpu_ns = 0;
  double server_cpu_ns = -1;  // negative: not measured
  std::string note;
  // Whether the run kept its configuration's in_flight calls outstanding, each issued as one
  // ended (a closed loop), so that fewer on average is worth a note (MakeRow). Not a stream's
  // reads (in_flight is its window, one Read at a time) nor blocking callers (one call each).
  bool keeps_window = true;
};

// What was run: the row's configuration, before MakeRow adds what was measured.
struct RunConfig {
  std::string system;  // "zrpc", "transport", "grpc"
  std::string workload;
  uint64_t size = 0;
  int in_flight = 1;
  int threads = 1;
  int connections = 1;
  int round = 0;
};

// The row of `config` with its measured figures (calls, seconds, latency, rates, CPU per call,
// note) from `run`, which must have at least one call. When a run that keeps a window of several
// calls (RunMeasurement::keeps_window) had fewer than kKeptWindowShare of them in flight on
// average (the latencies summed over the elapsed time), the note says how many it had.
WorkloadResult MakeRow(const RunConfig& config, RunMeasurement run);
inline constexpr double kKeptWindowShare = 0.8;

// The human-readable line of a row, and the header above such lines.
std::string RowHeader();
std::string FormatRow(const WorkloadResult& row);

// CPU time this process has used (all threads, user + system), in nanoseconds.
uint64_t ProcessCpuNanos();

// Where a benchmark client's rows go: a line each on stdout (under RowHeader, printed by Open),
// and a JSON line each appended to the --json file when one was given.
class RowWriter {
 public:
  // kInvalidArgument naming the file when `json_path` (if not empty) cannot be opened.
  static absl::StatusOr<RowWriter> Open(const std::string& json_path);
  void Write(const WorkloadResult& row);

 private:
  RowWriter() = default;
  std::ofstream json_;
};

}  // namespace zrpc::bench

#endif  // ZRPC_BENCHMARKS_RUN_ROW_H_
