// RPC metrics on the host: bucket placement at the bounds, percentiles within the documented
// error, exact totals under concurrent recording, the in-flight gauge, the registry's stable
// references, and the Prometheus text read back by a strict parser (tests/rpc/prometheus_parse.h).
#include "rpc/metrics.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/rpc/prometheus_parse.h"

namespace {

using zrpc::LatencyHistogram;
using zrpc::LatencySnapshot;
using zrpc::MethodMetrics;
using zrpc::MethodMetricsSnapshot;
using zrpc::Metrics;
using zrpc::MetricsSide;
using zrpc::testing::ParsePrometheusText;

constexpr int kOverflow = LatencyHistogram::kNumBounds;

// The documented percentile error: under 28% of the true value, or 1 us in the first bucket.
bool WithinDocumentedError(double estimate, double truth) {
  return std::abs(estimate - truth) <= std::max(0.28 * truth, 1e-6);
}

// The nearest-rank q-quantile of `sorted` (seconds), as LatencySnapshot::Percentile defines it.
double NearestRank(const std::vector<double>& sorted, double q) {
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const size_t k = std::max<size_t>(1, static_cast<size_t>(rank));
  return sorted[k - 1];
}

// Records `seconds` into a fresh histogram and checks every percentile against the truth.
void CheckPercentiles(std::vector<double> seconds) {
  LatencyHistogram histogram;
  for (double s : seconds) histogram.Record(absl::Nanoseconds(std::llround(s * 1e9)));
  std::sort(seconds.begin(), seconds.end());
  const LatencySnapshot snapshot = histogram.Snapshot();
  REQUIRE(snapshot.count == seconds.size());
  for (double q : {0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0}) {
    const double estimate = snapshot.Percentile(q);
    const double truth = NearestRank(seconds, q);
    INFO("q " << q << " estimate " << estimate << " truth " << truth);
    CHECK(WithinDocumentedError(estimate, truth));
  }
}

std::map<std::string, double> Parse(const std::string& text) {
  absl::StatusOr<std::map<std::string, double>> samples = ParsePrometheusText(text);
  INFO(samples.status().ToString() << "\n" << text);
  REQUIRE(samples.ok());
  return *samples;
}

int CountLines(const std::string& text, absl::string_view prefix) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) n += absl::StartsWith(line, prefix);
  return n;
}

}  // namespace

TEST_CASE("bucket bounds run from 1 us to 100 s, readable, at most 1.28 apart", "[metrics]") {
  absl::Span<const int64_t> bounds = LatencyHistogram::UpperBoundsNanos();
  REQUIRE(bounds.size() == 81);
  CHECK(bounds.front() == 1'000);
  CHECK(bounds.back() == 100'000'000'000);
  const std::vector<int64_t> first_decade(bounds.begin(), bounds.begin() + 11);
  CHECK(first_decade ==
        std::vector<int64_t>{1000, 1250, 1600, 2000, 2500, 3200, 4000, 5000, 6400, 8000, 10000});
  for (size_t i = 1; i < bounds.size(); ++i) {
    INFO("bound " << i);
    CHECK(bounds[i] > bounds[i - 1]);
    CHECK(static_cast<double>(bounds[i]) / static_cast<double>(bounds[i - 1]) <= 1.28);
  }
}

// BucketFor finds the bucket from the latency's power of two and a short scan; a binary search
// over the bounds is the reference it must agree with, at every power of two and around it, and
// at random latencies across the whole range.
TEST_CASE("the bucket lookup agrees with a binary search over the bounds", "[metrics]") {
  absl::Span<const int64_t> bounds = LatencyHistogram::UpperBoundsNanos();
  auto reference = [&](int64_t nanos) {
    return static_cast<int>(
        std::lower_bound(bounds.begin(), bounds.end(), std::max<int64_t>(nanos, 0)) -
        bounds.begin());
  };
  std::vector<int64_t> latencies = {0, 1, 999, 1000, 1001, INT64_MAX};
  for (int k = 0; k < 63; ++k) {
    const int64_t p = int64_t{1} << k;
    for (int64_t d : {-1, 0, 1}) latencies.push_back(p + d);
  }
  std::mt19937_64 random(7);
  for (int i = 0; i < 100000; ++i) {
    latencies.push_back(static_cast<int64_t>(random() >> (1 + random() % 63)));
  }
  for (int64_t nanos : latencies) {
    INFO(nanos << " ns");
    REQUIRE(LatencyHistogram::BucketFor(absl::Nanoseconds(nanos)) == reference(nanos));
  }
}

TEST_CASE("a latency lands in the first bucket whose bound it does not exceed", "[metrics]") {
  absl::Span<const int64_t> bounds = LatencyHistogram::UpperBoundsNanos();
  for (int i = 0; i < LatencyHistogram::kNumBounds; ++i) {
    INFO("bucket " << i << " bound " << bounds[i] << " ns");
    CHECK(LatencyHistogram::BucketFor(absl::Nanoseconds(bounds[i])) == i);
    CHECK(LatencyHistogram::BucketFor(absl::Nanoseconds(bounds[i] + 1)) == i + 1);
    CHECK(LatencyHistogram::BucketFor(absl::Nanoseconds(bounds[i] - 1)) == i);
  }
  CHECK(LatencyHistogram::BucketFor(absl::ZeroDuration()) == 0);
  CHECK(LatencyHistogram::BucketFor(absl::Nanoseconds(-5)) == 0);
  CHECK(LatencyHistogram::BucketFor(absl::Microseconds(3)) == 5);    // (2.5, 3.2] us
  CHECK(LatencyHistogram::BucketFor(absl::Milliseconds(64)) == 48);  // exactly 64 ms
  CHECK(LatencyHistogram::BucketFor(absl::Seconds(100)) == kOverflow - 1);
  CHECK(LatencyHistogram::BucketFor(absl::Seconds(101)) == kOverflow);
  CHECK(LatencyHistogram::BucketFor(absl::InfiniteDuration()) == kOverflow);
}

TEST_CASE("a histogram counts each latency once and sums them exactly", "[metrics]") {
  LatencyHistogram histogram;
  histogram.Record(absl::Nanoseconds(1));
  histogram.Record(absl::Microseconds(1));     // bucket 0, inclusive bound
  histogram.Record(absl::Nanoseconds(1001));   // bucket 1
  histogram.Record(absl::Seconds(150));        // overflow
  histogram.Record(absl::Nanoseconds(-7));     // as zero
  histogram.Record(absl::InfiniteDuration());  // overflow; sums as 24 h
  const LatencySnapshot s = histogram.Snapshot();
  CHECK(s.count == 6);
  CHECK(s.counts.size() == LatencyHistogram::kNumBuckets);
  CHECK(s.counts[0] == 3);
  CHECK(s.counts[1] == 1);
  CHECK(s.counts[kOverflow] == 2);
  CHECK(s.sum_nanos == 1 + 1000 + 1001 + 150'000'000'000 + 86'400'000'000'000);
  CHECK(s.upper_bounds_nanos.data() == LatencyHistogram::UpperBoundsNanos().data());
}

TEST_CASE("snapshots add up bucket by bucket, an empty one taking the other's", "[metrics]") {
  LatencyHistogram a, b;
  a.Record(absl::Nanoseconds(500));
  b.Record(absl::Nanoseconds(500));
  b.Record(absl::Seconds(150));
  LatencySnapshot sum;
  sum.Add(a.Snapshot());
  CHECK(sum.counts.size() == LatencyHistogram::kNumBuckets);
  sum.Add(b.Snapshot());
  CHECK(sum.count == 3);
  CHECK(sum.counts[0] == 2);
  CHECK(sum.counts[kOverflow] == 1);
  CHECK(sum.sum_nanos == 500 + 500 + 150'000'000'000);
  CHECK(sum.upper_bounds_nanos.data() == LatencyHistogram::UpperBoundsNanos().data());
}

TEST_CASE("percentiles interpolate within the bucket", "[metrics]") {
  LatencyHistogram histogram;
  CHECK(histogram.Snapshot().Percentile(0.5) == 0);  // empty
  // Four samples in (1 us, 1.25 us]: rank q * 4 lies a quarter of the way per sample.
  for (int i = 0; i < 4; ++i) histogram.Record(absl::Nanoseconds(1100 + i));
  LatencySnapshot s = histogram.Snapshot();
  CHECK(s.Percentile(0.25) == Approx(1062.5e-9));
  CHECK(s.Percentile(0.5) == Approx(1125e-9));
  CHECK(s.Percentile(1.0) == Approx(1250e-9));
  CHECK(s.Percentile(0.0) == Approx(1000e-9));
  CHECK(s.Percentile(7.0) == s.Percentile(1.0));   // clamped
  CHECK(s.Percentile(-1.0) == s.Percentile(0.0));  // clamped
  CHECK(s.Percentile(std::nan("")) == s.Percentile(0.0));
  // One sample above 100 s: the top percentile is the last bound, a lower bound.
  histogram.Record(absl::Seconds(1000));
  s = histogram.Snapshot();
  CHECK(s.Percentile(1.0) == Approx(100.0));
  CHECK(s.Percentile(0.5) == Approx(1156.25e-9));  // rank 2.5 of 4 in the first bucket
}

TEST_CASE("percentiles of known distributions are within the documented error", "[metrics]") {
  SECTION("uniform, 1 us .. 10 ms") {
    std::vector<double> seconds;
    for (int i = 0; i < 100'000; ++i) seconds.push_back(1e-6 + i * 1e-7);
    CheckPercentiles(seconds);
  }
  SECTION("log-uniform, 500 ns .. 50 s") {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> exponent(std::log(5e-7), std::log(50.0));
    std::vector<double> seconds;
    for (int i = 0; i < 100'000; ++i) seconds.push_back(std::exp(exponent(rng)));
    CheckPercentiles(seconds);
  }
  SECTION("RDMA-like: most calls 3 us, a tail to 80 us") {
    std::mt19937_64 rng(7);
    std::lognormal_distribution<double> latency(std::log(3e-6), 0.6);
    std::vector<double> seconds;
    for (int i = 0; i < 100'000; ++i) seconds.push_back(latency(rng));
    CheckPercentiles(seconds);
  }
  SECTION("every sample at a bucket's top, the worst case for interpolation") {
    CheckPercentiles(std::vector<double>(1000, 6.4e-3));
  }
}

TEST_CASE("4 threads x 10,000 calls add up exactly", "[metrics]") {
  Metrics metrics;
  constexpr int kThreads = 4;
  constexpr int kCalls = 10'000;
  std::vector<MethodMetrics*> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, &seen, t] {
      MethodMetrics& m = metrics.ForMethod(MetricsSide::kServer, "pkg.Svc/Get");
      seen[t] = &m;
      for (int i = 0; i < kCalls; ++i) {
        m.OnStart();
        m.AddMessageBytes(10, 20);
        m.AddBulkBytes(i % 2 == 0 ? 4096 : 0, 1);
        m.OnFinish(static_cast<absl::StatusCode>(i % zrpc::kNumStatusCodes),
                   absl::Nanoseconds(1 + (i % 1000) * 997));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (MethodMetrics* m : seen) CHECK(m == seen[0]);

  LatencyHistogram expected;
  uint64_t expected_finished[zrpc::kNumStatusCodes] = {};
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kCalls; ++i) {
      expected.Record(absl::Nanoseconds(1 + (i % 1000) * 997));
      ++expected_finished[i % zrpc::kNumStatusCodes];
    }
  }
  const std::vector<MethodMetricsSnapshot> all = metrics.Snapshot();
  REQUIRE(all.size() == 1);
  const MethodMetricsSnapshot& s = all[0];
  CHECK(s.side == MetricsSide::kServer);
  CHECK(s.method == "pkg.Svc/Get");
  CHECK(s.started == kThreads * kCalls);
  CHECK(s.finished_total == kThreads * kCalls);
  for (int code = 0; code < zrpc::kNumStatusCodes; ++code) {
    INFO("code " << code);
    CHECK(s.finished[code] == expected_finished[code]);
  }
  CHECK(s.in_flight == 0);
  CHECK(s.message_bytes_sent == 10u * kThreads * kCalls);
  CHECK(s.message_bytes_received == 20u * kThreads * kCalls);
  CHECK(s.bulk_bytes_sent == 4096u * kThreads * kCalls / 2);
  CHECK(s.bulk_bytes_received == 1u * kThreads * kCalls);
  const LatencySnapshot want = expected.Snapshot();
  CHECK(s.latency.count == kThreads * kCalls);
  CHECK(s.latency.counts == want.counts);
  CHECK(s.latency.sum_nanos == want.sum_nanos);

  const std::map<std::string, double> samples = Parse(metrics.PrometheusText());
  const std::string labels = "side=\"server\",method=\"pkg.Svc/Get\"";
  CHECK(samples.at("zrpc_calls_started_total{" + labels + "}") == kThreads * kCalls);
  CHECK(samples.at("zrpc_calls_finished_total{" + labels + ",code=\"DEADLINE_EXCEEDED\"}") ==
        expected_finished[4]);
  CHECK(samples.at("zrpc_call_latency_seconds_count{" + labels + "}") == kThreads * kCalls);
}

// Each thread records into a shard of its own (no atomic read-modify-write); more threads than
// there are shards share one with atomic adds; a thread that exits gives its index back and a
// later thread adds to the counts it left. However threads come and go, nothing is lost.
TEST_CASE("more threads than shards, in waves that reuse shards, add up exactly", "[metrics]") {
  Metrics metrics;
  MethodMetrics& m = metrics.ForMethod(MetricsSide::kClient, "pkg.Svc/Put");
  constexpr int kCalls = 500;
  const int waves[] = {MethodMetrics::kMaxShards + 36, 40, MethodMetrics::kMaxShards + 1};
  uint64_t total = 0;
  for (int threads_in_wave : waves) {
    std::vector<std::thread> threads;
    for (int t = 0; t < threads_in_wave; ++t) {
      threads.emplace_back([&m] {
        for (int i = 0; i < kCalls; ++i) {
          m.OnStart();
          m.AddMessageBytes(3, 0);
          m.OnFinish(absl::StatusCode::kOk, absl::Microseconds(5));
        }
      });
    }
    // A snapshot while they record never runs ahead of what was recorded.
    const MethodMetricsSnapshot during = m.Snapshot();
    CHECK(during.started <= total + uint64_t{kCalls} * threads_in_wave);
    CHECK(during.latency.count <= total + uint64_t{kCalls} * threads_in_wave);
    for (std::thread& thread : threads) thread.join();
    total += uint64_t{kCalls} * threads_in_wave;
    const MethodMetricsSnapshot s = m.Snapshot();
    CHECK(s.started == total);
    CHECK(s.finished[0] == total);
    CHECK(s.finished_total == total);
    CHECK(s.message_bytes_sent == 3 * total);
    CHECK(s.latency.count == total);
    CHECK(s.latency.sum_nanos == 5000 * total);
    CHECK(s.in_flight == 0);
  }
}

TEST_CASE("in flight is started minus finished; unknown codes count as UNKNOWN", "[metrics]") {
  Metrics metrics;
  MethodMetrics& m = metrics.ForMethod(MetricsSide::kClient, "pkg.Svc/Put");
  for (int i = 0; i < 5; ++i) m.OnStart();
  m.OnFinish(absl::StatusCode::kOk, absl::Microseconds(3));
  m.OnFinish(static_cast<absl::StatusCode>(99), absl::Microseconds(3));
  MethodMetricsSnapshot s = m.Snapshot();
  CHECK(s.in_flight == 3);
  CHECK(s.finished[static_cast<int>(absl::StatusCode::kUnknown)] == 1);
  CHECK(zrpc::StatusCodeLabel(static_cast<absl::StatusCode>(99)) == "UNKNOWN");
  CHECK(Parse(metrics.PrometheusText())
            .at("zrpc_calls_in_flight{side=\"client\",method=\"pkg.Svc/Put\"}") == 3);
  // More finished than started (a runtime bug, or a racing snapshot) reads as zero, not 2^64.
  for (int i = 0; i < 5; ++i) m.OnFinish(absl::StatusCode::kOk, absl::Microseconds(3));
  CHECK(m.Snapshot().in_flight == 0);
}

TEST_CASE("a latency in nanoseconds lands and sums as its duration would; negative counts as 0",
          "[metrics]") {
  Metrics metrics;
  MethodMetrics& m = metrics.ForMethod(MetricsSide::kServer, "pkg.Svc/A");
  // At most the first bound (1 us): -5, 0, 999 and 1000. Then 1001 ns, 1.25 ms.
  for (const int64_t nanos :
       {int64_t{-5}, int64_t{0}, int64_t{999}, int64_t{1000}, int64_t{1001}, int64_t{1'250'000}}) {
    m.OnFinishNanos(absl::StatusCode::kOk, nanos);
  }
  MethodMetricsSnapshot s = m.Snapshot();
  CHECK(s.latency.count == 6);
  CHECK(s.latency.counts[0] == 4);
  CHECK(s.latency.sum_nanos == 999 + 1000 + 1001 + 1'250'000);
  CHECK(s.latency.counts[LatencyHistogram::BucketFor(absl::Nanoseconds(1001))] == 1);
  CHECK(s.latency.counts[LatencyHistogram::BucketFor(absl::Microseconds(1250))] == 1);
  // Past the last bound (100 s), however far: the overflow bucket.
  m.OnFinishNanos(absl::StatusCode::kOk, 100'000'000'001);
  m.OnFinishNanos(absl::StatusCode::kOk, std::numeric_limits<int64_t>::max());
  s = m.Snapshot();
  CHECK(s.latency.counts[kOverflow] == 2);
  CHECK(s.finished[static_cast<int>(absl::StatusCode::kOk)] == 8);
}

TEST_CASE("the registry hands out one stable reference per side and method", "[metrics]") {
  Metrics metrics;
  MethodMetrics& get = metrics.ForMethod(MetricsSide::kClient, "pkg.Svc/Get");
  get.OnStart();
  CHECK(&metrics.ForMethod(MetricsSide::kClient, "pkg.Svc/Get") == &get);
  CHECK(&metrics.ForMethod(MetricsSide::kServer, "pkg.Svc/Get") != &get);
  for (int i = 0; i < 1000; ++i) metrics.ForMethod(MetricsSide::kServer, absl::StrCat("m", i));
  CHECK(&metrics.ForMethod(MetricsSide::kClient, "pkg.Svc/Get") == &get);
  CHECK(get.side() == MetricsSide::kClient);
  CHECK(get.method() == "pkg.Svc/Get");
  const std::vector<MethodMetricsSnapshot> all = metrics.Snapshot();
  REQUIRE(all.size() == 1002);
  CHECK(all[0].side == MetricsSide::kClient);  // client first, then by name
  CHECK(all[0].started == 1);
  CHECK(all[1].method == "m0");
  CHECK(all[2].method == "m1");
  CHECK(all.back().method == "pkg.Svc/Get");
}

TEST_CASE("the Prometheus text parses back and agrees with the snapshot", "[metrics]") {
  Metrics metrics;
  MethodMetrics& m = metrics.ForMethod(MetricsSide::kClient, "pkg.Svc/Get");
  for (int i = 0; i < 4; ++i) m.OnStart();
  m.OnFinish(absl::StatusCode::kOk, absl::Nanoseconds(1250));
  m.OnFinish(absl::StatusCode::kOk, absl::Microseconds(120));
  m.OnFinish(absl::StatusCode::kDeadlineExceeded, absl::Seconds(2));
  m.AddMessageBytes(12'345'678'901, 0);
  m.AddBulkBytes(0, 65536);
  metrics.ForMethod(MetricsSide::kServer, "pkg.Svc/Idle");
  const std::string text = metrics.PrometheusText(zrpc::ExposedBuckets::kFine);
  const std::map<std::string, double> samples = Parse(text);

  for (const char* family :
       {"zrpc_calls_started_total", "zrpc_calls_finished_total", "zrpc_calls_in_flight",
        "zrpc_message_bytes_total", "zrpc_bulk_bytes_total", "zrpc_call_latency_seconds"}) {
    INFO(family);
    CHECK(CountLines(text, absl::StrCat("# HELP ", family, " ")) == 1);
    CHECK(CountLines(text, absl::StrCat("# TYPE ", family, " ")) == 1);
  }
  CHECK(absl::StrContains(text, "# TYPE zrpc_call_latency_seconds histogram\n"));
  CHECK(absl::StrContains(text, "# TYPE zrpc_calls_in_flight gauge\n"));

  const std::string get = "side=\"client\",method=\"pkg.Svc/Get\"";
  const std::string idle = "side=\"server\",method=\"pkg.Svc/Idle\"";
  CHECK(samples.at("zrpc_calls_started_total{" + get + "}") == 4);
  CHECK(samples.at("zrpc_calls_finished_total{" + get + ",code=\"OK\"}") == 2);
  CHECK(samples.at("zrpc_calls_finished_total{" + get + ",code=\"DEADLINE_EXCEEDED\"}") == 1);
  CHECK(samples.count("zrpc_calls_finished_total{" + get + ",code=\"CANCELLED\"}") == 0);
  CHECK(samples.at("zrpc_calls_finished_total{" + idle + ",code=\"OK\"}") == 0);  // OK always
  CHECK(CountLines(text, "zrpc_calls_finished_total{") == 3);
  CHECK(samples.at("zrpc_calls_in_flight{" + get + "}") == 1);
  // Integers print as integers, never in exponent form.
  CHECK(absl::StrContains(
      text, "zrpc_message_bytes_total{" + get + ",direction=\"sent\"} 12345678901\n"));
  CHECK(samples.at("zrpc_message_bytes_total{" + get + ",direction=\"received\"}") == 0);
  CHECK(samples.at("zrpc_bulk_bytes_total{" + get + ",direction=\"received\"}") == 65536);

  // The histogram: readable bounds, cumulative, +Inf == _count == calls finished.
  const std::string bucket = "zrpc_call_latency_seconds_bucket{" + get + ",le=";
  CHECK(samples.at(bucket + "\"0.000001\"}") == 0);
  CHECK(samples.at(bucket + "\"0.00000125\"}") == 1);
  CHECK(samples.at(bucket + "\"0.0001\"}") == 1);
  CHECK(samples.at(bucket + "\"0.000125\"}") == 2);
  CHECK(samples.at(bucket + "\"0.064\"}") == 2);
  CHECK(samples.at(bucket + "\"2\"}") == 3);
  CHECK(samples.at(bucket + "\"100\"}") == 3);
  CHECK(samples.at(bucket + "\"+Inf\"}") == 3);
  CHECK(samples.at("zrpc_call_latency_seconds_count{" + get + "}") == 3);
  CHECK(absl::StrContains(text, "zrpc_call_latency_seconds_sum{" + get + "} 2.00012125\n"));
  double previous = 0;
  int buckets = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, bucket)) continue;
    const double cumulative = samples.at(std::string(line.substr(0, line.rfind(' '))));
    CHECK(cumulative >= previous);
    previous = cumulative;
    ++buckets;
  }
  CHECK(buckets == LatencyHistogram::kNumBounds + 1);
  CHECK(previous == 3);
  // Sample lines come after their family's # TYPE, in one group per family.
  CHECK(text.find("# TYPE zrpc_calls_in_flight") < text.find("zrpc_calls_in_flight{"));
  CHECK(text.find("zrpc_calls_started_total{") < text.find("# HELP zrpc_calls_finished_total"));
}

TEST_CASE(
    "by default the exposition shows the bounds 1, 2, 5 of each decade, with exact "
    "cumulative counts",
    "[metrics]") {
  Metrics metrics;
  MethodMetrics& m = metrics.ForMethod(MetricsSide::kServer, "pkg.Svc/Get");
  m.OnFinish(absl::StatusCode::kOk, absl::Nanoseconds(1250));  // in (1 us, 1.25 us]
  m.OnFinish(absl::StatusCode::kOk, absl::Microseconds(2));    // on a shown bound
  m.OnFinish(absl::StatusCode::kOk, absl::Microseconds(120));  // in (100 us, 125 us]
  m.OnFinish(absl::StatusCode::kOk, absl::Seconds(200));       // above 100 s
  const std::string text = metrics.PrometheusText();
  const std::map<std::string, double> samples = Parse(text);
  const std::string bucket =
      "zrpc_call_latency_seconds_bucket{side=\"server\",method=\"pkg.Svc/Get\",le=";
  CHECK(CountLines(text, bucket) == 26);  // 8 decades x 3, then 100 s, then +Inf
  CHECK(samples.count(bucket + "\"0.00000125\"}") == 0);
  CHECK(samples.at(bucket + "\"0.000001\"}") == 0);
  CHECK(samples.at(bucket + "\"0.000002\"}") == 2);
  CHECK(samples.at(bucket + "\"0.000005\"}") == 2);
  CHECK(samples.at(bucket + "\"0.0001\"}") == 2);
  CHECK(samples.at(bucket + "\"0.0002\"}") == 3);
  CHECK(samples.at(bucket + "\"50\"}") == 3);
  CHECK(samples.at(bucket + "\"100\"}") == 3);
  CHECK(samples.at(bucket + "\"+Inf\"}") == 4);
  // The fine exposition agrees wherever both show a bound.
  const std::map<std::string, double> fine =
      Parse(metrics.PrometheusText(zrpc::ExposedBuckets::kFine));
  CHECK(CountLines(metrics.PrometheusText(zrpc::ExposedBuckets::kFine), bucket) == 82);
  for (const auto& [series, value] : samples) {
    INFO(series);
    CHECK(fine.at(series) == value);
  }
}

TEST_CASE("label values are escaped: backslash, double quote, newline", "[metrics]") {
  Metrics metrics;
  metrics.ForMethod(MetricsSide::kServer, "we\"ird\\pkg.Svc/Get\nX").OnStart();
  const std::string text = metrics.PrometheusText();
  CHECK(absl::StrContains(text,
                          "zrpc_calls_started_total{side=\"server\","
                          "method=\"we\\\"ird\\\\pkg.Svc/Get\\nX\"} 1\n"));
  const std::map<std::string, double> samples = Parse(text);
  CHECK(samples.at("zrpc_calls_started_total{side=\"server\",method=\"we\\\"ird\\\\pkg.Svc/"
                   "Get\\nX\"}") == 1);
}

TEST_CASE("several registries expose as one, the same method summed", "[metrics]") {
  Metrics server, channel_a, channel_b;
  server.ForMethod(MetricsSide::kServer, "pkg.Svc/Get").OnStart();
  channel_a.ForMethod(MetricsSide::kClient, "pkg.Svc/Get").OnStart();
  channel_b.ForMethod(MetricsSide::kClient, "pkg.Svc/Get").OnStart();
  MethodMetrics& b = channel_b.ForMethod(MetricsSide::kClient, "pkg.Svc/Get");
  b.OnFinish(absl::StatusCode::kUnavailable, absl::Milliseconds(5));
  channel_a.ForMethod(MetricsSide::kClient, "pkg.Svc/Put").OnStart();
  const Metrics* all[] = {&server, &channel_a, nullptr, &channel_b};
  const std::string text = Metrics::PrometheusText(all);
  const std::map<std::string, double> samples = Parse(text);  // no duplicate series
  const std::string get = "{side=\"client\",method=\"pkg.Svc/Get\"";
  CHECK(samples.at("zrpc_calls_started_total" + get + "}") == 2);
  CHECK(samples.at("zrpc_calls_in_flight" + get + "}") == 1);
  CHECK(samples.at("zrpc_calls_finished_total" + get + ",code=\"UNAVAILABLE\"}") == 1);
  CHECK(samples.at("zrpc_call_latency_seconds_bucket" + get + ",le=\"0.005\"}") == 1);
  CHECK(samples.at("zrpc_calls_started_total{side=\"client\",method=\"pkg.Svc/Put\"}") == 1);
  CHECK(samples.at("zrpc_calls_started_total{side=\"server\",method=\"pkg.Svc/Get\"}") == 1);
  CHECK(CountLines(text, "# TYPE zrpc_calls_started_total") == 1);
  CHECK(Metrics::PrometheusText(absl::Span<const Metrics* const>()) == Metrics().PrometheusText());
}

TEST_CASE("the Prometheus parser accepts the format and refuses malformed text", "[metrics]") {
  const std::string head = "# HELP c A counter.\n# TYPE c counter\n";
  const std::string hist = "# TYPE h histogram\n";
  const std::string ok_hist =
      "h_bucket{a=\"x\",le=\"1\"} 1\nh_bucket{a=\"x\",le=\"+Inf\"} 2\nh_sum{a=\"x\"} 3\n"
      "h_count{a=\"x\"} 2\n";
  absl::StatusOr<std::map<std::string, double>> good = ParsePrometheusText(
      head + "c{a=\"1\",b=\"q\\\"\\\\\\n\",} 1.5e3 1700000000000\nc 7\n# a comment\n\n" + hist +
      ok_hist + "# TYPE g gauge\ng -Inf\n");
  INFO(good.status().ToString());
  REQUIRE(good.ok());
  CHECK(good->at("c{a=\"1\",b=\"q\\\"\\\\\\n\"}") == 1500);
  CHECK(good->at("c") == 7);
  CHECK(good->at("h_bucket{a=\"x\",le=\"+Inf\"}") == 2);
  CHECK(std::isinf(good->at("g")));
  CHECK(ParsePrometheusText("").ok());

  const std::vector<std::pair<const char*, std::string>> bad = {
      {"no newline at the end", head + "c 1"},
      {"no TYPE before the sample", "c 1\n"},
      {"TYPE twice", head + "# TYPE c counter\nc 1\n"},
      {"HELP twice", head + "# HELP c again\nc 1\n"},
      {"HELP after the samples", "# TYPE c counter\nc 1\n# HELP c x\n"},
      {"unknown type", "# TYPE c countr\nc 1\n"},
      {"family split in two groups", head + "c{a=\"1\"} 1\n# TYPE d gauge\nd 1\nc{a=\"2\"} 1\n"},
      {"duplicate series", head + "c{a=\"1\"} 1\nc{a=\"1\"} 2\n"},
      {"duplicate label", head + "c{a=\"1\",a=\"2\"} 1\n"},
      {"unknown escape", head + "c{a=\"\\t\"} 1\n"},
      {"unterminated label value", head + "c{a=\"1} 1\n"},
      {"label without quotes", head + "c{a=1} 1\n"},
      {"bad label name", head + "c{1a=\"1\"} 1\n"},
      {"bad metric name", "# TYPE 1c counter\n1c 1\n"},
      {"no value", head + "c\n"},
      {"comma decimal", head + "c 1,5\n"},
      {"trailing token", head + "c 1 2 3\n"},
      {"bad timestamp", head + "c 1 1.5\n"},
      {"negative counter", head + "c -1\n"},
      {"buckets not cumulative",
       hist + "h_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n"},
      {"+Inf bucket missing", hist + "h_bucket{le=\"1\"} 2\nh_count 2\n"},
      {"+Inf differs from _count", hist + "h_bucket{le=\"+Inf\"} 2\nh_count 3\n"},
      {"_count missing", hist + "h_bucket{le=\"+Inf\"} 2\nh_sum 1\n"},
      {"bucket without le", hist + "h_bucket 2\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n"},
  };
  for (const auto& [what, text] : bad) {
    INFO(what << ":\n" << text);
    CHECK(!ParsePrometheusText(text).ok());
  }
}
