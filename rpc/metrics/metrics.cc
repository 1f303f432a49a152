// Metrics (rpc/metrics.h): per-method counters and latency histograms, snapshots and Prometheus
// text.

#include "rpc/metrics.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zrpc {
namespace {

using Bounds = std::array<int64_t, LatencyHistogram::kNumBounds>;

// The R10 bucket bounds (file comment of metrics.h), in nanoseconds: ten per decade from 1 us,
// eight decades, then 100 s.
constexpr Bounds MakeBounds() {
  constexpr int64_t kFirstDecadeNanos[10] = {1000, 1250, 1600, 2000, 2500,
                                             3200, 4000, 5000, 6400, 8000};
  Bounds bounds{};
  int i = 0;
  int64_t scale = 1;
  for (int decade = 0; decade < 8; ++decade, scale *= 10) {
    for (int64_t nanos : kFirstDecadeNanos) bounds[i++] = nanos * scale;
  }
  bounds[i] = 1000 * scale;
  return bounds;
}

constexpr Bounds kBounds = MakeBounds();
static_assert(kBounds.front() == 1'000, "the first bucket ends at 1 us");
static_assert(kBounds.back() == 100'000'000'000, "the last bound is 100 s");
static_assert(kBounds[10] == 10'000 && kBounds[79] == 80'000'000'000, "ten per decade");

// Latencies added to the sum are capped here, so that even an infinite Duration adds a finite
// amount: 2^64 ns of capped latencies is more than 200,000 calls of 24 hours each.
constexpr int64_t kMaxSummedNanos = int64_t{24} * 3600 * 1'000'000'000;

constexpr const char* kStatusCodeLabels[kNumStatusCodes] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) == kNumStatusCodes - 1,
              "absl::StatusCode values are gRPC's, 0..16");

int CodeIndex(absl::StatusCode code) {
  const int i = static_cast<int>(code);
  return i >= 0 && i < kNumStatusCodes ? i : static_cast<int>(absl::StatusCode::kUnknown);
}

// Adds `src`'s counters to `dst`'s (same side and method).
void MergeInto(MethodMetricsSnapshot& dst, const MethodMetricsSnapshot& src) {
  dst.started += src.started;
  for (int i = 0; i < kNumStatusCodes; ++i) dst.finished[i] += src.finished[i];
  dst.finished_total += src.finished_total;
  dst.in_flight += src.in_flight;
  dst.message_bytes_sent += src.message_bytes_sent;
  dst.message_bytes_received += src.message_bytes_received;
  dst.bulk_bytes_sent += src.bulk_bytes_sent;
  dst.bulk_bytes_received += src.bulk_bytes_received;
  for (size_t i = 0; i < dst.latency.counts.size(); ++i) {
    dst.latency.counts[i] += src.latency.counts[i];
  }
  dst.latency.count += src.latency.count;
  dst.latency.sum_nanos += src.latency.sum_nanos;
}

// --- Prometheus text exposition format 0.0.4 ---------------------------------------------------

// A label value with backslash, double quote and newline escaped, as the format requires.
std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Nanoseconds as an exact decimal number of seconds, from integers only (no locale, no binary
// rounding): 1250 -> "0.00000125", 100'000'000'000 -> "100".
std::string Seconds(uint64_t nanos) {
  std::string out = absl::StrCat(nanos / 1'000'000'000);
  const uint64_t fraction = nanos % 1'000'000'000;
  if (fraction == 0) return out;
  std::string digits = absl::StrCat(fraction);
  digits.insert(0, 9 - digits.size(), '0');
  digits.erase(digits.find_last_not_of('0') + 1);
  absl::StrAppend(&out, ".", digits);
  return out;
}

void Family(std::string& out, absl::string_view name, absl::string_view type,
            absl::string_view help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

// One sample line: name{side="...",method="..."[,extra]} value. `labels` is the side and method
// part, already escaped; `extra` is empty or one more label, already escaped.
void Sample(std::string& out, absl::string_view name, absl::string_view labels,
            absl::string_view extra, absl::string_view value) {
  absl::StrAppend(&out, name, "{", labels, extra.empty() ? "" : ",", extra, "} ", value, "\n");
}

std::string BaseLabels(const MethodMetricsSnapshot& m) {
  return absl::StrCat("side=\"", MetricsSideName(m.side), "\",method=\"",
                      EscapeLabelValue(m.method), "\"");
}

// Whether ExposedBuckets::kCoarse shows `bound_nanos`: 1, 2 or 5 times a power of ten.
bool IsCoarseBound(int64_t bound_nanos) {
  while (bound_nanos % 10 == 0) bound_nanos /= 10;
  return bound_nanos == 1 || bound_nanos == 2 || bound_nanos == 5;
}

void WriteHistogram(std::string& out, absl::string_view labels, const LatencySnapshot& h,
                    ExposedBuckets buckets) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds_nanos.size(); ++i) {
    cumulative += h.counts[i];
    if (buckets == ExposedBuckets::kCoarse && !IsCoarseBound(h.upper_bounds_nanos[i])) continue;
    Sample(out, "zrpc_call_latency_seconds_bucket", labels,
           absl::StrCat("le=\"", Seconds(h.upper_bounds_nanos[i]), "\""), absl::StrCat(cumulative));
  }
  Sample(out, "zrpc_call_latency_seconds_bucket", labels, "le=\"+Inf\"", absl::StrCat(h.count));
  Sample(out, "zrpc_call_latency_seconds_sum", labels, "", Seconds(h.sum_nanos));
  Sample(out, "zrpc_call_latency_seconds_count", labels, "", absl::StrCat(h.count));
}

using Counter = uint64_t MethodMetricsSnapshot::*;

// One sample per method: `counter`, with no label beyond side and method.
void PerMethod(std::string& out, absl::string_view name,
               const std::vector<MethodMetricsSnapshot>& methods,
               const std::vector<std::string>& labels, Counter counter) {
  for (size_t i = 0; i < methods.size(); ++i) {
    Sample(out, name, labels[i], "", absl::StrCat(methods[i].*counter));
  }
}

// Two samples per method: direction="sent" and direction="received".
void PerDirection(std::string& out, absl::string_view name,
                  const std::vector<MethodMetricsSnapshot>& methods,
                  const std::vector<std::string>& labels, Counter sent, Counter received) {
  for (size_t i = 0; i < methods.size(); ++i) {
    Sample(out, name, labels[i], "direction=\"sent\"", absl::StrCat(methods[i].*sent));
    Sample(out, name, labels[i], "direction=\"received\"", absl::StrCat(methods[i].*received));
  }
}

std::string Exposition(const std::vector<MethodMetricsSnapshot>& methods, ExposedBuckets buckets) {
  std::vector<std::string> labels;
  labels.reserve(methods.size());
  for (const MethodMetricsSnapshot& m : methods) labels.push_back(BaseLabels(m));

  std::string out;
  Family(out, "zrpc_calls_started_total", "counter", "RPC calls started.");
  PerMethod(out, "zrpc_calls_started_total", methods, labels, &MethodMetricsSnapshot::started);
  Family(out, "zrpc_calls_finished_total", "counter", "RPC calls finished, by status code.");
  for (size_t i = 0; i < methods.size(); ++i) {
    for (int code = 0; code < kNumStatusCodes; ++code) {
      if (code != 0 && methods[i].finished[code] == 0) continue;
      Sample(out, "zrpc_calls_finished_total", labels[i],
             absl::StrCat("code=\"", kStatusCodeLabels[code], "\""),
             absl::StrCat(methods[i].finished[code]));
    }
  }
  Family(out, "zrpc_calls_in_flight", "gauge", "RPC calls started and not yet finished.");
  PerMethod(out, "zrpc_calls_in_flight", methods, labels, &MethodMetricsSnapshot::in_flight);
  Family(out, "zrpc_message_bytes_total", "counter", "Serialized RPC message bytes.");
  PerDirection(out, "zrpc_message_bytes_total", methods, labels,
               &MethodMetricsSnapshot::message_bytes_sent,
               &MethodMetricsSnapshot::message_bytes_received);
  Family(out, "zrpc_bulk_bytes_total", "counter", "RPC bulk payload bytes.");
  PerDirection(out, "zrpc_bulk_bytes_total", methods, labels,
               &MethodMetricsSnapshot::bulk_bytes_sent,
               &MethodMetricsSnapshot::bulk_bytes_received);
  Family(out, "zrpc_call_latency_seconds", "histogram", "Latency of finished RPC calls.");
  for (size_t i = 0; i < methods.size(); ++i) {
    WriteHistogram(out, labels[i], methods[i].latency, buckets);
  }
  return out;
}

}  // namespace

absl::string_view MetricsSideName(MetricsSide side) {
  return side == MetricsSide::kClient ? "client" : "server";
}

absl::string_view StatusCodeLabel(absl::StatusCode code) {
  return kStatusCodeLabels[CodeIndex(code)];
}

// --- LatencyHistogram --------------------------------------------------------------------------

absl::Span<const int64_t> LatencyHistogram::UpperBoundsNanos() { return kBounds; }

namespace {

// kFirstBoundFrom[k]: the first bucket whose bound is at least 2^k. A latency in [2^k, 2^(k+1))
// lands at or after it, within the few bounds an octave holds (ten per decade: at most four), so
// a lookup is a count of leading zeros and a short scan instead of a binary search over 81
// bounds: every call records one (metrics.h). The scan takes kOctaveScan steps whatever the
// latency, over bounds padded past the last, so a call's instructions do not depend on how long
// it took (count_instructions compares two phases' counts exactly).
constexpr std::array<uint8_t, 64> MakeFirstBoundFrom() {
  std::array<uint8_t, 64> first{};
  for (int k = 0; k < 63; ++k) {
    const int64_t at_least = int64_t{1} << k;
    int i = 0;
    while (i < LatencyHistogram::kNumBounds && kBounds[i] < at_least) ++i;
    first[k] = static_cast<uint8_t>(i);
  }
  first[63] = LatencyHistogram::kNumBounds;
  return first;
}
constexpr std::array<uint8_t, 64> kFirstBoundFrom = MakeFirstBoundFrom();

constexpr int kOctaveScan = 4;
constexpr int MostBoundsInAnOctave() {
  int most = 0;
  for (int k = 0; k < 62; ++k) {
    int n = 0;
    for (int64_t bound : kBounds)
      n += bound >= (int64_t{1} << k) && bound < (int64_t{1} << (k + 1));
    most = n > most ? n : most;
  }
  return most;
}
static_assert(MostBoundsInAnOctave() <= kOctaveScan, "an octave holds more bounds than a scan");

constexpr std::array<int64_t, LatencyHistogram::kNumBounds + kOctaveScan> MakePaddedBounds() {
  std::array<int64_t, LatencyHistogram::kNumBounds + kOctaveScan> padded{};
  for (int i = 0; i < LatencyHistogram::kNumBounds + kOctaveScan; ++i) {
    padded[i] = i < LatencyHistogram::kNumBounds ? kBounds[i] : INT64_MAX;
  }
  return padded;
}
constexpr auto kPaddedBounds = MakePaddedBounds();

int BucketForNanos(int64_t nanos) {
  if (nanos <= kBounds[0]) return 0;
  int i = kFirstBoundFrom[63 - __builtin_clzll(static_cast<uint64_t>(nanos))];
  for (int step = 0; step < kOctaveScan; ++step) i += kPaddedBounds[i] < nanos ? 1 : 0;
  return i;
}

// Where a latency goes: its bucket, and what it adds to the sum (capped: kMaxSummedNanos).
struct Placed {
  int bucket;
  uint64_t summed;
};
// A negative latency counts as 0. (A Duration comes as absl::ToInt64Nanoseconds, which saturates:
// InfiniteDuration() gives INT64_MAX, which lands in overflow.)
Placed PlaceNanos(int64_t nanos) {
  nanos = std::max<int64_t>(nanos, 0);
  return {BucketForNanos(nanos), static_cast<uint64_t>(std::min(nanos, kMaxSummedNanos))};
}

}  // namespace

int LatencyHistogram::BucketFor(absl::Duration latency) {
  return PlaceNanos(absl::ToInt64Nanoseconds(latency)).bucket;
}

void LatencyHistogram::Record(absl::Duration latency) {
  const Placed placed = PlaceNanos(absl::ToInt64Nanoseconds(latency));
  counts_[placed.bucket].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(placed.summed, std::memory_order_relaxed);
}

LatencySnapshot LatencyHistogram::Snapshot() const {
  LatencySnapshot s;
  s.upper_bounds_nanos = kBounds;
  s.counts.resize(kNumBuckets);
  for (int i = 0; i < kNumBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum_nanos = sum_nanos_.load(std::memory_order_relaxed);
  return s;
}

void LatencySnapshot::Add(const LatencySnapshot& other) {
  if (counts.empty()) {
    *this = other;
    return;
  }
  for (size_t b = 0; b < counts.size() && b < other.counts.size(); ++b)
    counts[b] += other.counts[b];
  count += other.count;
  sum_nanos += other.sum_nanos;
}

double LatencySnapshot::Percentile(double q) const {
  if (count == 0 || upper_bounds_nanos.empty()) return 0;
  if (!(q >= 0)) q = 0;  // also NaN
  if (q > 1) q = 1;
  // The bucket holding nearest rank max(1, ceil(rank)) is the first nonempty one whose
  // cumulative count reaches `rank`.
  const double rank = q * static_cast<double>(count);
  uint64_t below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    if (static_cast<double>(below + counts[i]) >= rank) {
      if (i >= upper_bounds_nanos.size()) break;  // overflow: no upper bound to interpolate to
      const double lo = i == 0 ? 0.0 : static_cast<double>(upper_bounds_nanos[i - 1]);
      const double hi = static_cast<double>(upper_bounds_nanos[i]);
      const double fraction = std::clamp((rank - static_cast<double>(below)) / counts[i], 0.0, 1.0);
      return (lo + fraction * (hi - lo)) * 1e-9;
    }
    below += counts[i];
  }
  return static_cast<double>(upper_bounds_nanos.back()) * 1e-9;
}

// --- Shard indexes -----------------------------------------------------------------------------

namespace internal {
namespace {

// The indexes no live thread holds. A std::mutex (TSan sees it, as the registry's): taken only
// at a thread's first recording and at its exit.
std::mutex index_mu;
std::vector<int>& FreeIndexes() {
  static std::vector<int>* free = [] {
    auto* v = new std::vector<int>;  // never destroyed: threads may exit after static teardown
    for (int i = MethodMetrics::kMaxShards - 1; i >= 0; --i) v->push_back(i);
    return v;
  }();
  return *free;
}

// Gives the thread's index back when the thread exits. The mutex orders the old owner's last
// writes before the next owner's first: a shard has one writer at a time.
struct IndexHolder {
  int index = -1;
  ~IndexHolder() {
    if (index < 0) return;
    // What this thread records from here on (another thread_local's destructor may still end a
    // call) goes to the shared shard: the index may have a new holder at once.
    metrics_thread_index = -1;
    std::lock_guard<std::mutex> lock(index_mu);
    FreeIndexes().push_back(index);
  }
};
thread_local IndexHolder index_holder;

}  // namespace

int TakeMetricsThreadIndex() {
  int index = -1;
  {
    std::lock_guard<std::mutex> lock(index_mu);
    std::vector<int>& free = FreeIndexes();
    if (!free.empty()) {
      index = free.back();
      free.pop_back();
    }
  }
  index_holder.index = index;
  metrics_thread_index = index;
  return index;
}

}  // namespace internal

// --- MethodMetrics -----------------------------------------------------------------------------

MethodMetrics::MethodMetrics(MetricsSide side, std::string method)
    : side_(side), method_(std::move(method)) {}

MethodMetrics::~MethodMetrics() {
  for (std::atomic<Shard*>& shard : shards_) delete shard.load(std::memory_order_acquire);
}

MethodMetrics::Shard& MethodMetrics::NewShard(int index) {
  // Only the thread holding `index` writes this entry (an earlier holder may have made it).
  auto* shard = new Shard;
  shards_[index].store(shard, std::memory_order_release);
  return *shard;
}

void MethodMetrics::OnFinish(absl::StatusCode code, absl::Duration latency) {
  OnFinishNanos(code, absl::ToInt64Nanoseconds(latency));
}

void MethodMetrics::OnFinishNanos(absl::StatusCode code, int64_t latency_nanos) {
  Shard& shard = ThisThreadShard();
  const Placed placed = PlaceNanos(latency_nanos);
  Bump(shard, shard.finished[CodeIndex(code)], 1);
  Bump(shard, shard.buckets[placed.bucket], 1);
  Bump(shard, shard.sum_nanos, placed.summed);
}

MethodMetricsSnapshot MethodMetrics::Snapshot() const {
  MethodMetricsSnapshot s;
  s.side = side_;
  s.method = method_;
  s.latency.upper_bounds_nanos = kBounds;
  s.latency.counts.assign(LatencyHistogram::kNumBuckets, 0);
  std::vector<const Shard*> shards = {&shared_};
  for (const std::atomic<Shard*>& shard : shards_) {
    if (const Shard* made = shard.load(std::memory_order_acquire)) shards.push_back(made);
  }
  auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  // Finished before started: a call is started before it finishes, so reading in this order
  // makes started >= finished the usual outcome while calls run (in_flight is clamped anyway).
  for (const Shard* shard : shards) {
    for (int i = 0; i < kNumStatusCodes; ++i) s.finished[i] += load(shard->finished[i]);
    for (int i = 0; i < LatencyHistogram::kNumBuckets; ++i) {
      s.latency.counts[i] += load(shard->buckets[i]);
    }
    s.latency.sum_nanos += load(shard->sum_nanos);
  }
  for (const Shard* shard : shards) {
    s.started += load(shard->started);
    s.message_bytes_sent += load(shard->message_bytes_sent);
    s.message_bytes_received += load(shard->message_bytes_received);
    s.bulk_bytes_sent += load(shard->bulk_bytes_sent);
    s.bulk_bytes_received += load(shard->bulk_bytes_received);
  }
  for (uint64_t finished : s.finished) s.finished_total += finished;
  for (uint64_t count : s.latency.counts) s.latency.count += count;
  s.in_flight = s.started > s.finished_total ? s.started - s.finished_total : 0;
  return s;
}

// --- Metrics -----------------------------------------------------------------------------------

MethodMetrics& Metrics::ForMethod(MetricsSide side, absl::string_view full_name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = methods_.try_emplace(Key(side, std::string(full_name)));
  if (inserted) it->second = std::make_unique<MethodMetrics>(side, it->first.second);
  return *it->second;
}

std::vector<MethodMetricsSnapshot> Metrics::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MethodMetricsSnapshot> out;
  out.reserve(methods_.size());
  for (const auto& [key, method] : methods_) out.push_back(method->Snapshot());
  return out;
}

void AppendPrometheusFamily(std::string& out, absl::string_view name, absl::string_view type,
                            absl::string_view help, uint64_t value) {
  Family(out, name, type, help);
  absl::StrAppend(&out, name, " ", value, "\n");
}

std::string Metrics::PrometheusText(ExposedBuckets buckets) const {
  const Metrics* self = this;
  return PrometheusText(absl::MakeConstSpan(&self, 1), buckets);
}

std::string Metrics::PrometheusText(absl::Span<const Metrics* const> registries,
                                    ExposedBuckets buckets) {
  std::map<std::pair<MetricsSide, std::string>, MethodMetricsSnapshot> merged;
  for (const Metrics* registry : registries) {
    if (registry == nullptr) continue;
    for (MethodMetricsSnapshot& m : registry->Snapshot()) {
      auto [it, inserted] = merged.try_emplace(std::make_pair(m.side, m.method));
      if (inserted) {
        it->second = std::move(m);
      } else {
        MergeInto(it->second, m);
      }
    }
  }
  std::vector<MethodMetricsSnapshot> methods;
  methods.reserve(merged.size());
  for (auto& [key, m] : merged) methods.push_back(std::move(m));
  return Exposition(methods, buckets);
}

}  // namespace zrpc
