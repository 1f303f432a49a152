// Metrics: per-method RPC counters and latency histograms, for clients and servers, read through
// an API (Snapshot) or as Prometheus text exposition format 0.0.4 (PrometheusText).
//
// What is counted. For each (side, method) pair -- side is client or server, method is the full
// name "package.Service/Method" -- a MethodMetrics holds: calls started; calls finished, by
// absl::StatusCode (0..16); message bytes and bulk bytes, each sent and received; and a latency
// histogram of finished calls. Calls in flight are not a counter of their own: a snapshot
// computes them as started minus finished, so the runtime never has to decrement anything.
//
// The hot path takes no lock and no locked instruction. The runtime looks a method's
// MethodMetrics up once (ForMethod takes a mutex and may allocate) and caches the reference;
// from then on OnStart, OnFinish, AddMessageBytes and AddBulkBytes add to the calling thread's
// own shard of the counters (a relaxed load and store each: the thread is the shard's only
// writer), and Snapshot sums the shards. OnFinish is three adds (status code, histogram bucket,
// latency sum) after a bucket lookup of a count of leading zeros and a short scan. A thread takes
// a shard index at its first recording and gives it back when it exits; past kMaxShards (64)
// threads at once, the rest share one shard with relaxed fetch_adds. Relaxed is enough because
// nothing is published through these counters; they only have to add up. Per call this saves the
// 8 or so locked instructions (and the cache line bounced between threads finishing calls of one
// method) that shared atomic counters cost (benchmarks/count_instructions).
//
// Why these buckets. Upper bounds follow the Renard R10 series, ten per decade, rounded so that
// every bound is a short decimal number of seconds (Prometheus' `le` label is read by people):
//
//     1, 1.25, 1.6, 2, 2.5, 3.2, 4, 5, 6.4, 8  x 10^k microseconds, k = 0..7, then 100 s
//
// that is 81 bounds from 1 us (0.000001) to 100 s, plus an overflow bucket above 100 s. Adjacent
// bounds differ by a factor of at most 1.28, so a percentile read from the histogram is within
// 28% of the true value anywhere in the range (LatencySnapshot::Percentile has the exact bound).
// 1-2-5 per decade would have given 25 buckets but up to 2.5x between bounds: an RDMA call's
// p50 of 3 us and p99 of 8 us would fall in the same two coarse buckets and percentiles would be
// off by up to 150%. Four buckets per power of two (ratio 1.19) would have needed ~110 buckets
// with bounds like 0.00000119. R10 also contains 1, 2 and 5 of every decade, so a coarser
// exposition could later drop buckets and stay exact (cumulative counts at a subset of bounds).
// Bounds are held as integer nanoseconds, so bucketing is exact and the `le` text is printed
// from integers, never from rounded binary fractions.
// The price would be cardinality: 84 series per (side, method) in Prometheus (82 `_bucket` lines
// with `+Inf`, `_sum`, `_count`), about 50 KB of text for five methods. So the exposition shows,
// by default, only the bounds 1, 2 and 5 of every decade (ExposedBuckets::kCoarse: 25 bounds and
// `+Inf`, the usual Prometheus spacing; cumulative counts at a subset of bounds are still exact),
// while Snapshot and Percentile keep all 81; kFine exposes all 81 for whoever wants them.
//
// Memory. A shard is 105 64-bit counters (1 started + 17 finished + 4 byte counters + 82 buckets
// + 1 latency sum), 896 bytes with its alignment; a MethodMetrics holds the shared one and one
// per thread that has recorded into it (made at that thread's first recording, kept for the
// index's next holder), its side and its name, plus a map node in the registry. A Metrics
// registry keeps one per (side, method) ever looked up, for its lifetime.
//
// Consistency of a snapshot. Every counter is exact, but a snapshot taken while calls run reads
// the counters one after another, not at one instant: finished may include a call whose latency
// is not yet in the histogram, or the reverse. In flight is clamped at zero for that reason. A
// snapshot of a quiescent MethodMetrics is exact and self-consistent. Within one snapshot the
// histogram's count is, by construction, the sum of its buckets (so Prometheus' `+Inf` bucket
// always equals `_count`).
//
// Threads. MethodMetrics' recording methods and Snapshot may be called from any number of
// threads at once. Metrics' methods are thread-safe (one std::mutex guards the method map, not
// the counters; std::, not absl::Mutex, so that ThreadSanitizer can check it, as in the slot
// pool: Debian's Abseil is not built for TSan). A reference returned by ForMethod stays valid,
// at the same address, for as long as the Metrics lives; the registry must outlive every thread
// that records into it.
//
// Prometheus exposition (text format 0.0.4). Families, each with `# HELP` and `# TYPE` once:
//
//     zrpc_calls_started_total            counter
//     zrpc_calls_finished_total           counter   extra label code="OK" | "CANCELLED" | ...
//     zrpc_calls_in_flight                gauge
//     zrpc_message_bytes_total            counter   extra label direction="sent" | "received"
//     zrpc_bulk_bytes_total               counter   extra label direction="sent" | "received"
//     zrpc_call_latency_seconds           histogram _bucket{le=...}, _sum, _count
//
// Every series has the labels side="client"|"server" and method="package.Service/Method", in
// that order, before the extra label. The code label is the canonical gRPC upper-case name
// (OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS,
// PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE,
// UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED) -- the names gRPC's own
// metrics and dashboards use; code="OK" is always emitted, other codes only once nonzero. A
// code outside 0..16 is counted as UNKNOWN. Label values are escaped as the format requires
// (backslash, double quote, newline). Integers print as integers; seconds print as exact
// decimals computed from integer nanoseconds; nothing depends on the C locale. Series come
// sorted by side, then method. When several registries are exposed together (a process with a
// server and channels), series of the same (side, method) are summed, since Prometheus refuses
// duplicate series.
#ifndef ZRPC_RPC_METRICS_H_
#define ZRPC_RPC_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace zrpc {

enum class MetricsSide { kClient, kServer };

// "client" or "server": the value of the `side` label.
absl::string_view MetricsSideName(MetricsSide side);

// The canonical gRPC upper-case name of `code` ("OK", "DEADLINE_EXCEEDED", ...): the value of the
// `code` label. A value outside 0..16 gives "UNKNOWN".
absl::string_view StatusCodeLabel(absl::StatusCode code);

// Number of absl::StatusCode values counted separately (0 = kOk .. 16 = kUnauthenticated).
inline constexpr int kNumStatusCodes = 17;

// A copy of a LatencyHistogram's buckets at one time.
struct LatencySnapshot {
  // Bucket i < kNumBounds counts latencies in (upper_bounds_nanos[i-1], upper_bounds_nanos[i]]
  // (bucket 0: [0, 1 us]); the last bucket counts latencies above the last bound (100 s).
  // upper_bounds_nanos views static storage (LatencyHistogram::UpperBoundsNanos()).
  absl::Span<const int64_t> upper_bounds_nanos;
  std::vector<uint64_t> counts;  // upper_bounds_nanos.size() + 1 entries
  uint64_t count = 0;            // sum of counts
  uint64_t sum_nanos = 0;        // sum of the recorded latencies, nanoseconds (see Record)

  // The q-quantile (0 <= q <= 1; clamped) in seconds, by linear interpolation within the bucket
  // that holds the sample of rank max(1, ceil(q * count)) (nearest rank). Error bound: that
  // sample lies in the same bucket (lo, hi] as the estimate, so the estimate is off by at most
  // hi - lo, i.e. by less than 28% of the true value, or 1 us in the first bucket. A rank in
  // the overflow bucket gives 100 s (a lower bound). An empty histogram gives 0.
  double Percentile(double q) const;
  // Adds `other`, a snapshot of the same buckets (another channel's, say): counts, count, sum.
  void Add(const LatencySnapshot& other);
};

// A fixed-bucket latency histogram (bounds in the file comment). Record is lock-free.
class LatencyHistogram {
 public:
  static constexpr int kNumBounds = 81;
  static constexpr int kNumBuckets = kNumBounds + 1;  // and the overflow bucket

  // The bucket upper bounds in nanoseconds, ascending: 1000, 1250, 1600, ..., 100'000'000'000.
  static absl::Span<const int64_t> UpperBoundsNanos();

  // The bucket `latency` falls in: the first i with latency <= bound i, else kNumBounds.
  // Negative latencies count as zero.
  static int BucketFor(absl::Duration latency);

  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // Lock-free. Negative latencies count as zero; for the sum, latencies are capped at 24 hours
  // (an infinite Duration would otherwise wrap it).
  void Record(absl::Duration latency);

  LatencySnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kNumBuckets> counts_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

namespace internal {
// The calling thread's shard index in every MethodMetrics, in [0, MethodMetrics::kMaxShards), or
// -1 when that many threads hold one (it then shares). Taken at the thread's first recording and
// given back when it exits, for a later thread to reuse (with the counts it left).
int TakeMetricsThreadIndex();
inline thread_local int metrics_thread_index = -2;  // -2: not taken yet
inline int MetricsThreadIndex() {
  const int index = metrics_thread_index;
  return index != -2 ? index : TakeMetricsThreadIndex();
}
}  // namespace internal

// A copy of one MethodMetrics' counters at one time (see "Consistency" in the file comment).
struct MethodMetricsSnapshot {
  MetricsSide side = MetricsSide::kClient;
  std::string method;  // "package.Service/Method"
  uint64_t started = 0;
  std::array<uint64_t, kNumStatusCodes> finished{};  // indexed by absl::StatusCode value
  uint64_t finished_total = 0;                       // sum of finished
  uint64_t in_flight = 0;                            // started - finished_total, at least 0
  uint64_t message_bytes_sent = 0;
  uint64_t message_bytes_received = 0;
  uint64_t bulk_bytes_sent = 0;
  uint64_t bulk_bytes_received = 0;
  LatencySnapshot latency;
};

// The metrics of one method on one side. Get one from Metrics::ForMethod, keep the reference,
// and call the recording methods from any thread: each is one or a few relaxed atomic adds.
class MethodMetrics {
 public:
  MethodMetrics(MetricsSide side, std::string method);
  MethodMetrics(const MethodMetrics&) = delete;
  MethodMetrics& operator=(const MethodMetrics&) = delete;

  MetricsSide side() const { return side_; }
  const std::string& method() const { return method_; }

  ~MethodMetrics();

  // A call began (client: issued; server: request dispatched to the handler).
  void OnStart() {
    Shard& shard = ThisThreadShard();
    Bump(shard, shard.started, 1);
  }

  // A call ended with `code` after `latency` (client: issue to completion; server: dispatch to
  // response sent). Every OnStart should be matched by exactly one OnFinish.
  void OnFinish(absl::StatusCode code, absl::Duration latency);
  // The same with the latency in nanoseconds (negative counts as 0): the runtime's form, which
  // converts nothing.
  void OnFinishNanos(absl::StatusCode code, int64_t latency_nanos);

  // Serialized message bytes, and bulk payload bytes, moved for this method. Zeros cost nothing.
  void AddMessageBytes(uint64_t sent, uint64_t received) {
    if ((sent | received) == 0) return;
    Shard& shard = ThisThreadShard();
    if (sent != 0) Bump(shard, shard.message_bytes_sent, sent);
    if (received != 0) Bump(shard, shard.message_bytes_received, received);
  }
  void AddBulkBytes(uint64_t sent, uint64_t received) {
    if ((sent | received) == 0) return;
    Shard& shard = ThisThreadShard();
    if (sent != 0) Bump(shard, shard.bulk_bytes_sent, sent);
    if (received != 0) Bump(shard, shard.bulk_bytes_received, received);
  }

  MethodMetricsSnapshot Snapshot() const;

  // Threads that record with shards of their own at once; more share one, with atomic adds.
  static constexpr int kMaxShards = 64;

 private:
  // One thread's counters ("Threads" in the file comment). The thread that owns the shard's
  // index is its only writer: it adds with a relaxed load and store (no locked instruction, no
  // cache line shared with another writer); `shared_` takes every thread past kMaxShards, with
  // fetch_add. Snapshot sums the shards.
  struct alignas(64) Shard {
    std::atomic<uint64_t> started{0};
    std::array<std::atomic<uint64_t>, kNumStatusCodes> finished{};
    std::atomic<uint64_t> message_bytes_sent{0};
    std::atomic<uint64_t> message_bytes_received{0};
    std::atomic<uint64_t> bulk_bytes_sent{0};
    std::atomic<uint64_t> bulk_bytes_received{0};
    std::array<std::atomic<uint64_t>, LatencyHistogram::kNumBuckets> buckets{};
    std::atomic<uint64_t> sum_nanos{0};
  };

  void Bump(Shard& shard, std::atomic<uint64_t>& counter, uint64_t by) {
    if (&shard == &shared_) {
      counter.fetch_add(by, std::memory_order_relaxed);
    } else {
      counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
    }
  }
  Shard& ThisThreadShard() {
    const int index = internal::MetricsThreadIndex();
    if (index < 0) return shared_;
    Shard* shard = shards_[index].load(std::memory_order_relaxed);
    return shard != nullptr ? *shard : NewShard(index);
  }
  Shard& NewShard(int index);

  const MetricsSide side_;
  const std::string method_;
  std::array<std::atomic<Shard*>, kMaxShards> shards_{};
  Shard shared_;
};

// Which latency bucket bounds the Prometheus exposition shows (see "Why these buckets").
enum class ExposedBuckets {
  kCoarse,  // 1, 2, 5 x 10^k us and 100 s: 25 bounds, 26 `_bucket` lines per (side, method)
  kFine,    // all 81 bounds: 82 `_bucket` lines
};

// The registry of one Server or Channel: one MethodMetrics per (side, method). Thread-safe.
class Metrics {
 public:
  Metrics() = default;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The metrics of `full_name` ("package.Service/Method") on `side`, created (zeroed) on first
  // use. Takes a lock and may allocate: call it once per method and keep the reference, which
  // stays valid for this registry's lifetime.
  MethodMetrics& ForMethod(MetricsSide side, absl::string_view full_name);

  // Every method's counters, sorted by side (client first), then method name.
  std::vector<MethodMetricsSnapshot> Snapshot() const;

  // This registry in Prometheus text exposition format 0.0.4 (see the file comment).
  std::string PrometheusText(ExposedBuckets buckets = ExposedBuckets::kCoarse) const;

  // Several registries in one exposition; series of the same (side, method) are summed. Null
  // pointers are skipped.
  static std::string PrometheusText(absl::Span<const Metrics* const> registries,
                                    ExposedBuckets buckets = ExposedBuckets::kCoarse);

 private:
  using Key = std::pair<MetricsSide, std::string>;

  mutable std::mutex mu_;  // guards methods_
  // Entries are never erased and each MethodMetrics has its own allocation, so references
  // handed out stay valid; the map is ordered so that Snapshot needs no sort.
  std::map<Key, std::unique_ptr<MethodMetrics>> methods_;
};

// Appends one family of a single unlabelled sample, with its `# HELP` and `# TYPE` lines, in the
// exposition's format: for figures shown beside the per-method families (a server's stats).
void AppendPrometheusFamily(std::string& out, absl::string_view name, absl::string_view type,
                            absl::string_view help, uint64_t value);

}  // namespace zrpc

#endif  // ZRPC_RPC_METRICS_H_
