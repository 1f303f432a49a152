// LatencyRecorder, Summarize and AggregateRounds. JSON is in report_json.cc, ratios and the
// table in report_ratios.cc, the SVG in report_svg.cc.
#include "benchmarks/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace zrpc::bench {

LatencyRecorder::LatencyRecorder(size_t capacity, uint64_t seed)
    : capacity_(std::max<size_t>(capacity, 1)),
      // xorshift's state must not be zero; mix the seed so that seeds 1, 2, 3 differ at once.
      random_state_((seed ^ 0x9e3779b97f4a7c15ULL) | 1) {
  samples_.reserve(capacity_);
}

uint64_t LatencyRecorder::NextRandom() {
  // xorshift64*: a handful of cycles, plenty good enough to pick reservoir slots.
  random_state_ ^= random_state_ >> 12;
  random_state_ ^= random_state_ << 25;
  random_state_ ^= random_state_ >> 27;
  return random_state_ * 0x2545f4914f6cdd1dULL;
}

void LatencyRecorder::ReplaceRandomSample(int64_t nanos) {
  // Algorithm R: the count_-th sample (count_ already includes it) takes slot j, uniform in
  // [0, count_), when j < capacity_. The multiply-high maps 64 random bits onto [0, count_)
  // without a division.
  const uint64_t j =
      static_cast<uint64_t>((static_cast<unsigned __int128>(NextRandom()) * count_) >> 64);
  if (j < capacity_) samples_[j] = nanos;
}

void LatencyRecorder::Merge(const LatencyRecorder& other) {
  if (other.count_ == 0) return;
  const uint64_t total = count_ + other.count_;
  if (!sampled() && !other.sampled() && samples_.size() + other.samples_.size() <= capacity_) {
    samples_.insert(samples_.end(), other.samples_.begin(), other.samples_.end());
  } else {
    // Each side keeps a share of the capacity proportional to the calls it recorded; a random
    // subset of a uniform sample is a uniform sample, so the union's sample is uniform too.
    size_t want_other = static_cast<size_t>(
        std::llround(static_cast<double>(capacity_) * other.count_ / static_cast<double>(total)));
    want_other = std::min(want_other, other.samples_.size());
    const size_t want_this = std::min(samples_.size(), capacity_ - want_other);
    want_other = std::min(other.samples_.size(), capacity_ - want_this);
    // Partial Fisher-Yates: the first `want` elements become a uniform random subset.
    auto choose = [this](std::vector<int64_t>& v, size_t want) {
      for (size_t i = 0; i < want; ++i) {
        const size_t j = i + NextRandom() % (v.size() - i);
        std::swap(v[i], v[j]);
      }
      v.resize(want);
    };
    std::vector<int64_t> theirs = other.samples_;
    choose(samples_, want_this);
    choose(theirs, want_other);
    samples_.insert(samples_.end(), theirs.begin(), theirs.end());
  }
  count_ = total;
  sum_nanos_ += other.sum_nanos_;
  min_nanos_ = std::min(min_nanos_, other.min_nanos_);
  max_nanos_ = std::max(max_nanos_, other.max_nanos_);
}

void LatencyRecorder::Clear() {
  samples_.clear();
  count_ = 0;
  sum_nanos_ = 0;
  min_nanos_ = std::numeric_limits<int64_t>::max();
  max_nanos_ = std::numeric_limits<int64_t>::min();
}

namespace {

// Nearest rank, in integers: the sample of 1-based rank ceil(per_mille * n / 1000).
int64_t NearestRank(const std::vector<int64_t>& sorted, uint64_t per_mille) {
  const uint64_t n = sorted.size();
  uint64_t rank = (per_mille * n + 999) / 1000;
  rank = std::clamp<uint64_t>(rank, 1, n);
  return sorted[rank - 1];
}

// Everything but count, min, max and mean, from sorted samples.
void FillFromSorted(const std::vector<int64_t>& sorted, size_t max_cdf_points, Summary& s) {
  if (sorted.empty()) return;
  s.p50_nanos = NearestRank(sorted, 500);
  s.p90_nanos = NearestRank(sorted, 900);
  s.p99_nanos = NearestRank(sorted, 990);
  s.p999_nanos = NearestRank(sorted, 999);
  const size_t n = sorted.size();
  const size_t m = std::min(n, std::max<size_t>(max_cdf_points, 2));
  s.cdf_nanos.reserve(m);
  if (m == 1) {
    s.cdf_nanos.push_back(sorted[0]);
    return;
  }
  for (size_t i = 0; i < m; ++i) {
    // round(i * (n - 1) / (m - 1)) in integers.
    const size_t index = (2 * i * (n - 1) + (m - 1)) / (2 * (m - 1));
    s.cdf_nanos.push_back(sorted[index]);
  }
}

}  // namespace

Summary Summarize(const LatencyRecorder& recorder, size_t max_cdf_points) {
  std::vector<int64_t> sorted = recorder.samples();
  std::sort(sorted.begin(), sorted.end());
  Summary s;
  if (recorder.count() == 0) return s;
  s.count = recorder.count();
  s.min_nanos = recorder.min_nanos();
  s.max_nanos = recorder.max_nanos();
  s.mean_nanos = static_cast<double>(recorder.sum_nanos()) / static_cast<double>(s.count);
  s.sampled = recorder.sampled();
  FillFromSorted(sorted, max_cdf_points, s);
  // A reservoir may have missed the extremes; the CDF's ends are the exact ones.
  s.cdf_nanos.front() = s.min_nanos;
  s.cdf_nanos.back() = s.max_nanos;
  return s;
}

Summary Summarize(std::vector<int64_t> samples_nanos, size_t max_cdf_points) {
  std::sort(samples_nanos.begin(), samples_nanos.end());
  Summary s;
  if (samples_nanos.empty()) return s;
  s.count = samples_nanos.size();
  s.min_nanos = samples_nanos.front();
  s.max_nanos = samples_nanos.back();
  double sum = 0;
  for (int64_t v : samples_nanos) sum += static_cast<double>(v);
  s.mean_nanos = sum / static_cast<double>(s.count);
  FillFromSorted(samples_nanos, max_cdf_points, s);
  return s;
}

void SetLatency(const Summary& summary, WorkloadResult& result) {
  auto us = [](int64_t nanos) { return static_cast<double>(nanos) / 1000.0; };
  result.p50_us = us(summary.p50_nanos);
  result.p90_us = us(summary.p90_nanos);
  result.p99_us = us(summary.p99_nanos);
  result.p999_us = us(summary.p999_nanos);
  result.max_us = us(summary.max_nanos);
  result.cdf_us.clear();
  for (int64_t v : summary.cdf_nanos) result.cdf_us.push_back(us(v));
}

// ---------------------------------------------------------------------------------------------
// Aggregation.

namespace {

int Rank(absl::string_view value, std::initializer_list<absl::string_view> known) {
  int i = 0;
  for (absl::string_view k : known) {
    if (value == k) return i;
    ++i;
  }
  return i;
}

// The sort and group key: known systems and workloads in report order, then others by name.
using Key = std::tuple<int, std::string, int, std::string, uint64_t, int, int, int>;

Key KeyOf(const WorkloadResult& r) {
  return Key(Rank(r.system, {"zrpc", "transport", "grpc", "perftest"}), r.system,
             Rank(r.workload, {"echo", "put", "get", "send_lat", "send_bw", "write_bw"}),
             r.workload, r.size, r.in_flight, r.threads, r.connections);
}

// The median of the values `keep` accepts; `none` if it accepts none.
template <typename Keep>
double MedianOf(std::vector<double> values, Keep keep, double none) {
  values.erase(std::remove_if(values.begin(), values.end(),
                              [&](double v) { return std::isnan(v) || !keep(v); }),
               values.end());
  if (values.empty()) return none;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Aggregate AggregateGroup(const std::vector<const WorkloadResult*>& runs) {
  Aggregate a;
  a.rounds = static_cast<int>(runs.size());
  WorkloadResult& m = a.median;
  const WorkloadResult& first = *runs.front();
  m.system = first.system;
  m.workload = first.workload;
  m.size = first.size;
  m.in_flight = first.in_flight;
  m.threads = first.threads;
  m.connections = first.connections;
  m.round = -1;

  auto median = [&](double WorkloadResult::*field) {
    std::vector<double> v;
    for (const WorkloadResult* r : runs) v.push_back(r->*field);
    return MedianOf(
        v, [](double) { return true; }, std::nan(""));
  };
  auto median_measured = [&](double WorkloadResult::*field) {
    std::vector<double> v;
    for (const WorkloadResult* r : runs) v.push_back(r->*field);
    return MedianOf(
        v, [](double x) { return x >= 0; }, -1);
  };
  std::vector<double> calls;
  for (const WorkloadResult* r : runs) calls.push_back(static_cast<double>(r->calls));
  m.calls = static_cast<uint64_t>(std::llround(MedianOf(
      calls, [](double) { return true; }, 0)));
  m.seconds = median(&WorkloadResult::seconds);
  m.p50_us = median(&WorkloadResult::p50_us);
  m.p90_us = median(&WorkloadResult::p90_us);
  m.p99_us = median(&WorkloadResult::p99_us);
  m.p999_us = median(&WorkloadResult::p999_us);
  m.max_us = median(&WorkloadResult::max_us);
  m.calls_per_sec = median(&WorkloadResult::calls_per_sec);
  m.goodput_mib_per_sec = median(&WorkloadResult::goodput_mib_per_sec);
  m.client_cpu_us_per_call = median_measured(&WorkloadResult::client_cpu_us_per_call);
  m.server_cpu_us_per_call = median_measured(&WorkloadResult::server_cpu_us_per_call);

  // The CDF of the round with the lower-median p50 (nearest rank 50 of the rounds' p50s).
  std::vector<const WorkloadResult*> by_p50 = runs;
  std::stable_sort(
      by_p50.begin(), by_p50.end(),
      [](const WorkloadResult* x, const WorkloadResult* y) { return x->p50_us < y->p50_us; });
  m.cdf_us = by_p50[(by_p50.size() + 1) / 2 - 1]->cdf_us;

  // Each distinct part once: a run's note joins parts with "; ", and a part with a figure of its
  // own (the calls a run kept in flight) differs between rounds where the rest does not.
  std::vector<std::string> notes;
  for (const WorkloadResult* r : runs) {
    for (absl::string_view part : absl::StrSplit(r->note, "; ", absl::SkipEmpty())) {
      if (std::find(notes.begin(), notes.end(), part) == notes.end()) {
        notes.emplace_back(part);
      }
    }
  }
  m.note = absl::StrJoin(notes, "; ");
  for (const WorkloadResult* r : runs) a.runs.push_back(*r);
  std::sort(a.runs.begin(), a.runs.end(),
            [](const WorkloadResult& x, const WorkloadResult& y) { return x.round < y.round; });
  return a;
}

}  // namespace

absl::StatusOr<std::vector<Aggregate>> AggregateRounds(const std::vector<WorkloadResult>& results) {
  std::map<Key, std::vector<const WorkloadResult*>> groups;
  for (const WorkloadResult& r : results) {
    std::vector<const WorkloadResult*>& runs = groups[KeyOf(r)];
    for (const WorkloadResult* seen : runs) {
      if (seen->round == r.round) {
        return absl::InvalidArgumentError(
            absl::StrCat("two results for ", r.system, " ", r.workload, " size ", r.size,
                         " in_flight ", r.in_flight, " threads ", r.threads, " connections ",
                         r.connections, " round ", r.round, " (a file given twice?)"));
      }
    }
    runs.push_back(&r);
  }
  std::vector<Aggregate> out;
  out.reserve(groups.size());
  for (const auto& [key, runs] : groups) out.push_back(AggregateGroup(runs));
  return out;
}

}  // namespace zrpc::bench
