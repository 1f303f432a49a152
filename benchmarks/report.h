// Benchmark results: recorded on the hot path, written as JSON Lines, merged across rounds and
// programs, compared against targets, and shown as a table, a ratios block and an SVG.
//
// The benchmark of zrpc against gRPC and perftest is several programs (the zrpc and gRPC clients,
// a wrapper around perftest's ib_* tools) run in alternating rounds. Each program appends one
// WorkloadResult per run to a JSON Lines file; bench_report reads every file, groups the runs by
// configuration, takes the median of each figure across rounds and prints how zrpc stands
// against its targets. Everything here is device-independent; it depends on Abseil and, for
// the JSON (report_json.cc), on protobuf.
//
// Conventions every producer follows:
//  - Latency figures are microseconds; p50_us..max_us of a zrpc or gRPC "echo" are ROUND TRIPS
//    (request out, response back, as the caller sees it).
//  - perftest's ib_send_lat reports ONE-WAY latency (half its measured round trip). Its rows are
//    recorded as perftest printed them: workload "send_lat", p50_us = one-way. The latency ratio
//    below doubles them; nothing else does.
//  - perftest's bandwidth tools report messages/s and MiB/s; they go to calls_per_sec and
//    goodput_mib_per_sec (1 MiB = 2^20 bytes).
//  - A CPU figure that was not measured is negative.
//
// Thread-safety: LatencyRecorder is not synchronised; give each measuring thread its own and
// Merge() them when measuring is over. Everything else is a pure function of its arguments.
#ifndef ZRPC_BENCHMARKS_REPORT_H_
#define ZRPC_BENCHMARKS_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zrpc::bench {

// ---------------------------------------------------------------------------------------------
// Recording and summarising latencies.

// Latency samples of one measuring thread, in nanoseconds.
//
// The sample buffer is allocated once, in the constructor (`capacity` samples, 8 bytes each);
// Record() never allocates, takes no lock and costs a few compares and a store. Count, min, max
// and sum are exact whatever the capacity. Once more than `capacity` samples have been recorded,
// the buffer is a uniform reservoir sample of all of them (Vitter's Algorithm R, with a
// xorshift generator seeded by `seed`): sample i > capacity replaces a random slot with
// probability capacity / i. Percentiles are then estimates from the reservoir (Summary::sampled
// says so); min and max stay exact. Size the capacity to the calls a run measures and no
// sampling happens. A capacity of 0 is taken as 1.
class LatencyRecorder {
 public:
  explicit LatencyRecorder(size_t capacity, uint64_t seed = 1);

  void Record(absl::Duration latency) { RecordNanos(absl::ToInt64Nanoseconds(latency)); }
  void RecordNanos(int64_t nanos) {
    ++count_;
    sum_nanos_ += nanos;
    if (nanos < min_nanos_) min_nanos_ = nanos;
    if (nanos > max_nanos_) max_nanos_ = nanos;
    if (samples_.size() < capacity_) {
      samples_.push_back(nanos);  // within the reserved capacity: no allocation
    } else {
      ReplaceRandomSample(nanos);
    }
  }

  // Adds `other`'s samples to this recorder (not on the hot path: it may allocate a scratch copy).
  // Count, min, max and sum add up exactly. The samples are concatenated when both recorders
  // kept every sample and the total fits this recorder's capacity; otherwise each side keeps a
  // random subset in proportion to the calls it recorded, so the result is again a uniform
  // sample of the union. The capacity stays this recorder's.
  void Merge(const LatencyRecorder& other);

  // Forgets everything recorded; keeps the buffer.
  void Clear();

  uint64_t count() const { return count_; }
  int64_t min_nanos() const { return count_ == 0 ? 0 : min_nanos_; }
  int64_t max_nanos() const { return count_ == 0 ? 0 : max_nanos_; }
  int64_t sum_nanos() const { return sum_nanos_; }
  size_t capacity() const { return capacity_; }
  // The stored samples, in no particular order.
  const std::vector<int64_t>& samples() const { return samples_; }
  // True when some recorded samples are not stored (the stored ones are a reservoir sample).
  bool sampled() const { return count_ > samples_.size(); }

 private:
  void ReplaceRandomSample(int64_t nanos);
  uint64_t NextRandom();

  size_t capacity_;
  std::vector<int64_t> samples_;
  uint64_t count_ = 0;
  int64_t sum_nanos_ = 0;
  int64_t min_nanos_ = std::numeric_limits<int64_t>::max();
  int64_t max_nanos_ = std::numeric_limits<int64_t>::min();
  uint64_t random_state_;
};

// At most this many points in a Summary's CDF (and so in a result's cdf_us).
inline constexpr size_t kMaxCdfPoints = 200;

// The distribution of a run's latencies.
//
// Percentiles use the nearest-rank definition: of n samples sorted ascending, the p-th
// percentile is the sample of 1-based rank ceil(p/100 * n) (computed in integers, so p99.9 of
// 1000 samples is rank 999 exactly). It is always a latency that was measured, never an
// interpolation. With n = 1 every percentile is the sample; with n = 2, p50 is the smaller and
// p90 up the larger; with n < 1000, p99.9 is the maximum.
//
// The CDF is the latency at m evenly spaced quantiles, m = min(n, max_cdf_points):
// cdf_nanos[i] is the sample of 0-based sorted index round(i * (n - 1) / (m - 1)), at cumulative
// fraction i / (m - 1) (a single point, when n = 1, is at fraction 1). Its first point is the
// minimum and its last the maximum.
struct Summary {
  uint64_t count = 0;  // all calls recorded, sampled or not
  int64_t min_nanos = 0;
  int64_t max_nanos = 0;
  double mean_nanos = 0;
  int64_t p50_nanos = 0;
  int64_t p90_nanos = 0;
  int64_t p99_nanos = 0;
  int64_t p999_nanos = 0;
  std::vector<int64_t> cdf_nanos;
  bool sampled = false;  // percentiles and inner CDF points estimated from a reservoir sample
};

// Summarises a recorder: count, min, max and mean exact; percentiles and CDF from its samples
// (exact unless recorder.sampled()), the CDF's end points the exact min and max. An empty
// recorder gives an all-zero Summary with an empty CDF. Sorts a copy: call it after measuring.
Summary Summarize(const LatencyRecorder& recorder, size_t max_cdf_points = kMaxCdfPoints);
// The same for every latency of a run, in any order.
Summary Summarize(std::vector<int64_t> samples_nanos, size_t max_cdf_points = kMaxCdfPoints);

// ---------------------------------------------------------------------------------------------
// The result of one run, one line of a JSON Lines file.

struct WorkloadResult {
  std::string system;    // "zrpc", "transport" (zrpc's transport alone), "grpc", "perftest"
  std::string workload;  // "echo", "put", "get", "send_lat", "send_bw", "write_bw"
  uint64_t size = 0;     // payload bytes per call (per message for perftest)
  int in_flight = 1;     // calls outstanding at once (perftest: its tx depth; 1 for send_lat)
  int threads = 1;
  int connections = 1;
  int round = 0;       // which alternating round produced it
  uint64_t calls = 0;  // calls (messages) measured
  double seconds = 0;  // wall time of the measured phase
  // Latency in microseconds: round trip for zrpc and gRPC, one-way for perftest send_lat.
  double p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
  double calls_per_sec = 0;
  double goodput_mib_per_sec = 0;      // payload MiB/s (2^20 bytes)
  double client_cpu_us_per_call = -1;  // negative = not measured
  double server_cpu_us_per_call = -1;  // negative = not measured
  std::vector<double> cdf_us;  // latency at evenly spaced quantiles, as in Summary::cdf_nanos
  std::string note;            // free text (device, flags, anything odd)
};

// Fills result's latency figures and CDF from `summary` (nanoseconds to microseconds).
void SetLatency(const Summary& summary, WorkloadResult& result);

// One JSON object on one line, ending in '\n', keys in the struct's order, written by
// protobuf's JSON printer from the message json::Row (report_row.proto). Bytes of a string that
// are not UTF-8 become U+FFFD. Numbers are written in a form that reads back to the same double.
// NaN and infinities have no JSON form: they are written as null, which ParseJsonLines reads
// back as NaN. size and calls are JSON numbers, so at most 2^53 - 1 (beyond, the reader
// refuses them). An empty cdf_us is left out.
std::string ToJsonLine(const WorkloadResult& result);

// Reads JSON Lines as ToJsonLine writes them (and as it wrote them before it used protobuf), with
// protobuf's JSON parser. Lines that are empty or only whitespace are skipped; every other line
// must be one JSON object. Keys: every field of WorkloadResult is required except cdf_us and note
// (default empty); size and calls must be integers in [0, 2^53 - 1], the int fields integers in
// their range; a double field may be null (read as NaN); unknown keys, of any JSON type, are
// ignored so that newer producers can add fields. An error is kInvalidArgument "line N: what
// was wrong", with protobuf's words and the text from where it stopped for a syntax error.
// protobuf's parser is lenient where the hand-written one was not: it takes a trailing comma,
// raw control characters in strings, and a number key given twice (the last wins).
absl::StatusOr<std::vector<WorkloadResult>> ParseJsonLines(absl::string_view text);

// ---------------------------------------------------------------------------------------------
// Aggregation across rounds.

// The runs of one configuration -- (system, workload, size, in_flight, threads, connections) --
// merged across rounds. `median` holds the configuration, the median of each figure across the
// rounds (for an even number, the mean of the two middle values; NaN figures are left out, and
// for the CPU figures so are negative "not measured" ones, -1 if no round measured it), and
// round = -1. Its cdf_us is one real round's, not a blend: the round whose p50 is the lower
// median of the rounds' p50s (nearest rank). Its note is the distinct notes joined by "; ".
struct Aggregate {
  WorkloadResult median;
  int rounds = 0;
  std::vector<WorkloadResult> runs;  // each round's result, by round
};

// Groups and takes medians. The output is ordered by system (zrpc, transport, grpc, perftest,
// then others by name), workload (echo, put, get, send_lat, send_bw, write_bw, then others),
// size, in_flight, threads, connections. Two results of the same configuration and round (say, a
// file given twice) are refused with kInvalidArgument naming them.
absl::StatusOr<std::vector<Aggregate>> AggregateRounds(const std::vector<WorkloadResult>& results);

// ---------------------------------------------------------------------------------------------
// Ratios against targets.
//
// Rows are compared like for like: the same size, threads and connections on both sides, and
//  1. "zrpc echo p50 / (2 x perftest send_lat p50)", target <= 1.15: zrpc's round trip
//     against perftest's one-way latency doubled, at in_flight 1 on both sides.
//  2. "zrpc put MiB/s / perftest write_bw MiB/s", target >= 0.95: bulk goodput, each side's row
//     with the largest in_flight measured (throughput wants a deep queue; both depths shown).
//  3. "zrpc echo calls/s / perftest send_bw msg/s", target >= 0.9: likewise, largest in_flight.
//  4. "grpc echo p50 / zrpc echo p50", target >= 20: at in_flight 1.
// One Ratio per zrpc row that qualifies. A zrpc row with no counterpart gives an unavailable
// Ratio saying which rows are missing; when zrpc has no qualifying rows at all, one unavailable
// Ratio says so. A value is never estimated.
struct Ratio {
  std::string name;        // e.g. "zrpc echo p50 / (2 x perftest send_lat p50)"
  std::string where;       // the configuration, e.g. "64 B, in_flight 1, 1x1"
  bool has_target = true;  // false: a layer figure (ComputeLayerRatios), no target, never "met"
  double target = 0;
  bool higher_is_better = false;  // target is a minimum (>=) rather than a maximum (<=)
  bool available = false;
  // When available: the median over the rounds both sides ran of the ratio within each round
  // (figures of one round share the guest's mood; across rounds it moves by +-30 % under
  // emulation), and its spread. `rounds` 0: no round in common, value is the medians' ratio.
  double value = 0;
  int rounds = 0;
  double min = 0, max = 0;
  bool met = false;     // when available: the median meets the target
  std::string missing;  // when not: "no perftest rows for send_lat 64 B, in_flight 1, 1x1"
};

std::vector<Ratio> ComputeRatios(const std::vector<Aggregate>& aggregates);

// Where zrpc's cost over perftest arises, when transport_bench's rows (system "transport": the
// transport alone, no RPC layer) are present; otherwise nothing. Layer figures, no targets:
//  - "transport echo p50 / (2 x perftest send_lat p50)": what the transport adds to the fabric;
//  - "zrpc echo p50 / transport echo p50": what the RPC layer adds to the transport;
//  - the same two for the message rate at the largest in_flight (transport vs ib_send_bw, zrpc
//    vs transport).
std::vector<Ratio> ComputeLayerRatios(const std::vector<Aggregate>& aggregates);

// ---------------------------------------------------------------------------------------------
// Output.

// The table for people: a header line, then one fixed-width line per aggregate (system,
// workload, size, in_flight, threads x conns, p50/p90/p99/p99.9/max in us, calls/s, MiB/s,
// CPU us/call client/server, rounds). A figure not measured -- NaN, or a negative CPU figure --
// shows as "-": perftest's bandwidth tools measure no latency, so their rows write null there.
std::string FormatTable(const std::vector<Aggregate>& aggregates);

// The ratios block: one line per Ratio with its value and target and "met" or "MISSED", or
// "n/a (<missing>)".
std::string FormatRatios(const std::vector<Ratio>& ratios);

// A JSON document {"results": [...], "ratios": [...]}: each result is ToJsonLine's object plus
// "rounds"; each ratio has name, where, target (null for a layer figure), higher_is_better,
// value and met (null when not available, or for a layer figure) and missing. Ends in '\n'.
std::string ToJsonDocument(const std::vector<Aggregate>& aggregates,
                           const std::vector<Ratio>& ratios);

// A standalone SVG (hand-written, 800x500) of latency CDFs for `workload` at `size`: one
// polyline per system, log-scale x axis in microseconds with labelled ticks at decades, y from
// 0 to 1 with gridlines, a legend and a title. Per system the row with the smallest in_flight,
// then fewest threads x connections, is drawn. For workload "echo", perftest's send_lat row is
// drawn doubled (round trip), labelled so. A row with an empty cdf_us is listed in the legend as
// "(no CDF)" and not drawn. kNotFound when no row matches.
absl::StatusOr<std::string> RenderCdfSvg(const std::vector<Aggregate>& aggregates,
                                         absl::string_view workload, uint64_t size);

}  // namespace zrpc::bench

#endif  // ZRPC_BENCHMARKS_REPORT_H_
