// LatencyRecorder, Summarize, AggregateRounds, ComputeRatios and the table (benchmarks/report.h).
#include "benchmarks/report.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "benchmarks/run_row.h"

namespace zrpc::bench {
namespace {

std::vector<int64_t> Iota(int64_t from, int64_t to) {  // [from, to]
  std::vector<int64_t> v(to - from + 1);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST_CASE("nearest-rank percentiles of one sample are that sample", "[report][summary]") {
  const Summary s = Summarize(std::vector<int64_t>{42});
  CHECK(s.count == 1);
  CHECK(s.p50_nanos == 42);
  CHECK(s.p90_nanos == 42);
  CHECK(s.p99_nanos == 42);
  CHECK(s.p999_nanos == 42);
  CHECK(s.max_nanos == 42);
  CHECK(s.cdf_nanos == std::vector<int64_t>{42});
}

TEST_CASE("nearest-rank percentiles of two samples: p50 the smaller, p90 up the larger",
          "[report][summary]") {
  const Summary s = Summarize(std::vector<int64_t>{200, 100});  // any order
  CHECK(s.p50_nanos == 100);                                    // rank ceil(0.5 * 2) = 1
  CHECK(s.p90_nanos == 200);                                    // rank ceil(1.8) = 2
  CHECK(s.p99_nanos == 200);
  CHECK(s.p999_nanos == 200);
  CHECK(s.min_nanos == 100);
  CHECK(s.max_nanos == 200);
  CHECK(s.mean_nanos == 150);
  CHECK(s.cdf_nanos == std::vector<int64_t>{100, 200});
}

TEST_CASE("nearest-rank percentiles of 1..10 and 1..100 by hand", "[report][summary]") {
  const Summary ten = Summarize(Iota(1, 10));
  CHECK(ten.p50_nanos == 5);   // ceil(5) = 5
  CHECK(ten.p90_nanos == 9);   // ceil(9) = 9
  CHECK(ten.p99_nanos == 10);  // ceil(9.9) = 10
  CHECK(ten.p999_nanos == 10);
  const Summary hundred = Summarize(Iota(1, 100));
  CHECK(hundred.p50_nanos == 50);
  CHECK(hundred.p90_nanos == 90);
  CHECK(hundred.p99_nanos == 99);
  CHECK(hundred.p999_nanos == 100);  // ceil(99.9) = 100: with n < 1000, p99.9 is the max
}

TEST_CASE("p99.9 is the maximum below 1000 samples and rank 999 at exactly 1000",
          "[report][summary]") {
  CHECK(Summarize(Iota(1, 999)).p999_nanos == 999);
  CHECK(Summarize(Iota(1, 999)).p99_nanos == 990);  // ceil(989.01) = 990
  const Summary s = Summarize(Iota(1, 1000));
  CHECK(s.p999_nanos == 999);  // exactly 999, no floating-point rounding up to 1000
  CHECK(s.p99_nanos == 990);
  CHECK(s.p50_nanos == 500);
  CHECK(Summarize(Iota(1, 1001)).p999_nanos == 1000);  // ceil(999.999) = 1000
}

TEST_CASE("ties: percentiles land on the repeated value", "[report][summary]") {
  const Summary s = Summarize(std::vector<int64_t>{7, 5, 5, 5, 9});
  CHECK(s.p50_nanos == 5);  // rank 3 of 5,5,5,7,9
  CHECK(s.p90_nanos == 9);  // rank ceil(4.5) = 5
  const Summary all_same = Summarize(std::vector<int64_t>(50, 3));
  CHECK(all_same.p50_nanos == 3);
  CHECK(all_same.p999_nanos == 3);
  CHECK(all_same.cdf_nanos == std::vector<int64_t>(50, 3));
}

TEST_CASE("an empty summary is all zero with no CDF", "[report][summary]") {
  const Summary s = Summarize(std::vector<int64_t>{});
  CHECK(s.count == 0);
  CHECK(s.p50_nanos == 0);
  CHECK(s.cdf_nanos.empty());
  CHECK(Summarize(LatencyRecorder(10)).cdf_nanos.empty());
}

TEST_CASE("the CDF is at most 200 points, evenly spaced, from min to max", "[report][summary]") {
  const Summary s = Summarize(Iota(0, 9999));
  REQUIRE(s.cdf_nanos.size() == 200);
  CHECK(s.cdf_nanos.front() == 0);
  CHECK(s.cdf_nanos.back() == 9999);
  CHECK(s.cdf_nanos[1] == 50);      // round(1 * 9999 / 199) = round(50.246)
  CHECK(s.cdf_nanos[100] == 5025);  // round(100 * 9999 / 199) = round(5024.6)
  CHECK(std::is_sorted(s.cdf_nanos.begin(), s.cdf_nanos.end()));
  CHECK(Summarize(Iota(1, 50)).cdf_nanos == Iota(1, 50));  // fewer samples than points: all
  CHECK(Summarize(Iota(1, 50), 5).cdf_nanos == std::vector<int64_t>{1, 13, 26, 38, 50});
}

TEST_CASE("a recorder within capacity keeps every sample exactly", "[report][recorder]") {
  LatencyRecorder r(100);
  for (int64_t v : Iota(1, 100)) r.RecordNanos(v);
  r.Record(absl::Microseconds(1));  // the 101st: reservoir from here on
  CHECK(r.count() == 101);
  CHECK(r.samples().size() == 100);
  CHECK(r.sampled());
  LatencyRecorder exact(1000);
  for (int64_t v : Iota(1, 1000)) exact.RecordNanos(v);
  CHECK_FALSE(exact.sampled());
  const Summary s = Summarize(exact);
  CHECK(s.p50_nanos == 500);
  CHECK(s.p999_nanos == 999);
  CHECK(s.mean_nanos == 500.5);
  CHECK_FALSE(s.sampled);
}

TEST_CASE("a full recorder keeps exact count, min, max and sum and a fair reservoir",
          "[report][recorder]") {
  LatencyRecorder r(1000, /*seed=*/7);
  const int64_t n = 100000;
  for (int64_t v = 1; v <= n; ++v) r.RecordNanos(v);
  CHECK(r.count() == static_cast<uint64_t>(n));
  CHECK(r.samples().size() == 1000);
  CHECK(r.min_nanos() == 1);
  CHECK(r.max_nanos() == n);
  CHECK(r.sum_nanos() == n * (n + 1) / 2);
  const Summary s = Summarize(r);
  CHECK(s.sampled);
  CHECK(s.cdf_nanos.front() == 1);  // the exact extremes, whatever the reservoir kept
  CHECK(s.cdf_nanos.back() == n);
  CHECK(s.max_nanos == n);
  // A uniform sample of 1..n: its median is near n/2 (1000 samples: within ~5% easily).
  CHECK(std::abs(s.p50_nanos - n / 2) < n / 20);
  CHECK(std::abs(s.p90_nanos - n * 9 / 10) < n / 20);
}

TEST_CASE("recording never grows the sample buffer", "[report][recorder]") {
  LatencyRecorder r(64);
  const int64_t* data = r.samples().data();
  for (int i = 0; i < 10000; ++i) r.RecordNanos(i);
  CHECK(r.samples().data() == data);
  CHECK(r.samples().capacity() == 64);
}

TEST_CASE("merging recorders adds up exactly and stays within capacity", "[report][recorder]") {
  LatencyRecorder a(100), b(100);
  for (int64_t v : Iota(1, 30)) a.RecordNanos(v);
  for (int64_t v : Iota(31, 60)) b.RecordNanos(v);
  a.Merge(b);
  CHECK(a.count() == 60);
  CHECK_FALSE(a.sampled());  // 60 fit: concatenated
  CHECK(Summarize(a).p50_nanos == 30);
  CHECK(a.sum_nanos() == 60 * 61 / 2);

  LatencyRecorder big(100, 1), small(100, 2);
  for (int64_t v = 0; v < 900; ++v) big.RecordNanos(1000);  // 900 calls at 1000 ns
  for (int64_t v = 0; v < 100; ++v) small.RecordNanos(5);   // 100 calls at 5 ns
  big.Merge(small);
  CHECK(big.count() == 1000);
  CHECK(big.samples().size() == 100);
  CHECK(big.min_nanos() == 5);
  CHECK(big.max_nanos() == 1000);
  // In proportion to the calls: 90 of one, 10 of the other.
  CHECK(std::count(big.samples().begin(), big.samples().end(), 5) == 10);
  big.Clear();
  CHECK(big.count() == 0);
  CHECK(big.max_nanos() == 0);
}

WorkloadResult Row(const std::string& system, const std::string& workload, uint64_t size,
                   int in_flight, int round, double p50_us) {
  WorkloadResult r;
  r.system = system;
  r.workload = workload;
  r.size = size;
  r.in_flight = in_flight;
  r.round = round;
  r.calls = 1000;
  r.seconds = 1;
  r.p50_us = p50_us;
  r.p90_us = r.p99_us = r.p999_us = r.max_us = p50_us * 2;
  r.calls_per_sec = 1e6 / p50_us * in_flight;
  r.goodput_mib_per_sec = r.calls_per_sec * size / (1 << 20);
  return r;
}

TEST_CASE("rounds are grouped by configuration and each figure is its median",
          "[report][aggregate]") {
  std::vector<WorkloadResult> rs;
  for (int round = 0; round < 3; ++round) {
    WorkloadResult r = Row("zrpc", "echo", 64, 1, round, 10 + round);  // 10, 11, 12
    r.cdf_us = {static_cast<double>(round)};
    r.client_cpu_us_per_call = round == 1 ? -1 : 2.0 * round;  // 0, -, 4: median 2
    r.note = round == 0 ? "" : "rxe0";
    rs.push_back(r);
  }
  rs.push_back(Row("zrpc", "echo", 64, 1, 3, 100));  // a 4th round: median 11.5
  rs.push_back(Row("perftest", "send_lat", 64, 1, 0, 5));
  rs.push_back(Row("grpc", "echo", 64, 1, 0, 300));
  absl::StatusOr<std::vector<Aggregate>> agg = AggregateRounds(rs);
  REQUIRE(agg.ok());
  REQUIRE(agg->size() == 3);
  // Ordered zrpc, grpc, perftest.
  CHECK((*agg)[0].median.system == "zrpc");
  CHECK((*agg)[1].median.system == "grpc");
  CHECK((*agg)[2].median.system == "perftest");
  const Aggregate& z = (*agg)[0];
  CHECK(z.rounds == 4);
  CHECK(z.median.round == -1);
  CHECK(z.median.p50_us == 11.5);                // mean of the two middle values of 10, 11, 12, 100
  CHECK(z.median.client_cpu_us_per_call == 2);   // the unmeasured round left out
  CHECK(z.median.server_cpu_us_per_call == -1);  // no round measured it
  CHECK(z.median.cdf_us == std::vector<double>{1});  // the round with the lower-median p50 (11)
  CHECK(z.median.note == "rxe0");
}

TEST_CASE("the same configuration and round twice is refused", "[report][aggregate]") {
  std::vector<WorkloadResult> rs = {Row("zrpc", "echo", 64, 1, 0, 10),
                                    Row("zrpc", "echo", 64, 1, 0, 11)};
  absl::StatusOr<std::vector<Aggregate>> agg = AggregateRounds(rs);
  REQUIRE_FALSE(agg.ok());
  CHECK(std::string(agg.status().message()).find("round 0") != std::string::npos);
}

std::vector<Aggregate> MustAggregate(const std::vector<WorkloadResult>& rs) {
  absl::StatusOr<std::vector<Aggregate>> agg = AggregateRounds(rs);
  REQUIRE(agg.ok());
  return *agg;
}

TEST_CASE("ratios are computed like for like against their targets", "[report][ratios]") {
  std::vector<WorkloadResult> rs = {
      Row("zrpc", "echo", 64, 1, 0, 11),         // round trip 11 us
      Row("perftest", "send_lat", 64, 1, 0, 5),  // one-way 5 us: ratio 11 / 10 = 1.1
      Row("grpc", "echo", 64, 1, 0, 330),        // 330 / 11 = 30
      Row("zrpc", "put_registered", 65536, 4, 0, 100),
      Row("zrpc", "put_registered", 65536, 16, 0, 100),  // the deepest row is compared
      Row("perftest", "write_bw", 65536, 128, 0, 100),
      Row("zrpc", "echo", 64, 16, 0, 20),                // 800k calls/s
      Row("perftest", "send_bw_bidir", 64, 128, 0, 50),  // 2.56M msg/s both ways: 0.625
      Row("zrpc", "put", 65536, 16, 0, 100),             // staged: a figure, no target
      Row("zrpc", "echo_event", 64, 1, 0, 14),           // event mode, round trip 14 us
      Row("perftest", "send_lat_event", 64, 1, 0, 5),    // one-way 5 us with -e: 1.4
      Row("zrpc", "stream", 4096, 16, 0, 40),            // 400k msg/s
      Row("perftest", "send_bw", 4096, 128, 0, 160),     // 800k msg/s: 0.5, beside 64 B's
      Row("zrpc", "echo_blocking_event", 64, 1, 0, 28),  // the defaults: 28 / 14 = 2
  };
  rs[4].goodput_mib_per_sec = 970;
  rs[5].goodput_mib_per_sec = 1000;  // 0.97
  rs[8].goodput_mib_per_sec = 500;   // 0.5
  const std::vector<Ratio> ratios = ComputeRatios(MustAggregate(rs));
  REQUIRE(ratios.size() == 8);
  CHECK(ratios[0].available);
  CHECK(ratios[0].value == Approx(1.1));
  CHECK(ratios[0].met);
  CHECK(ratios[0].where == "64 B, in_flight 1, 1x1");
  CHECK(ratios[1].value == Approx(0.97));
  CHECK(ratios[1].met);
  CHECK(ratios[1].where == "65536 B, in_flight 16 vs 128, 1x1");
  CHECK(ratios[2].value == Approx(0.5));
  CHECK_FALSE(ratios[2].has_target);
  CHECK(ratios[3].value == Approx(0.625));
  CHECK(ratios[3].name == "zrpc echo calls/s / (perftest send_bw -b msg/s / 2)");
  CHECK_FALSE(ratios[3].met);
  CHECK(ratios[4].value == Approx(1.4));
  CHECK(ratios[4].name == "zrpc event echo p50 / (2 x perftest send_lat -e p50)");
  CHECK_FALSE(ratios[4].met);  // target <= 1.3
  CHECK(ratios[5].name == "zrpc default-config echo p50 / zrpc event echo p50");
  CHECK(ratios[5].value == Approx(2));
  CHECK_FALSE(ratios[5].met);  // target <= 1.5
  CHECK(ratios[6].name == "zrpc stream msg/s / perftest send_bw msg/s");
  CHECK(ratios[6].value == Approx(0.5));
  CHECK(ratios[6].where == "4096 B, in_flight 16 vs 128, 1x1");
  CHECK_FALSE(ratios[6].has_target);
  CHECK(ratios[7].value == Approx(30));
  CHECK(ratios[7].met);
  CHECK(ratios[7].rounds == 1);
  const std::string text = FormatRatios(ratios);
  CHECK(text.find("MISSED") != std::string::npos);
  CHECK(text.find("target <= 1.15  met") != std::string::npos);
}

TEST_CASE("a ratio is the median of the ratios within each round, with their spread",
          "[report][ratios]") {
  // Round 1 ran fast for both, round 2 slow for both: the per-round ratios are 1.1, 1.2, 1.0,
  // while the medians' ratio, 26 / (2 x 10) = 1.3, would mix rounds the guest ran at other speeds
  // (and a round only one side ran).
  const std::vector<Ratio> ratios = ComputeRatios(MustAggregate({
      Row("zrpc", "echo", 64, 1, 0, 22), Row("perftest", "send_lat", 64, 1, 0, 10),
      Row("zrpc", "echo", 64, 1, 1, 12), Row("perftest", "send_lat", 64, 1, 1, 5),
      Row("zrpc", "echo", 64, 1, 2, 40), Row("perftest", "send_lat", 64, 1, 2, 20),
      Row("zrpc", "echo", 64, 1, 3, 30),  // a round perftest did not run: not counted
  }));
  REQUIRE(ratios[0].available);
  CHECK(ratios[0].rounds == 3);
  CHECK(ratios[0].value == Approx(1.1));
  CHECK(ratios[0].min == Approx(1.0));
  CHECK(ratios[0].max == Approx(1.2));
  CHECK(FormatRatios(ratios).find("1.100 (1.000-1.200, 3 rd)") != std::string::npos);
}

TEST_CASE("a ratio with a side missing is n/a and names what is missing", "[report][ratios]") {
  const std::vector<Ratio> ratios = ComputeRatios(MustAggregate({
      Row("zrpc", "echo", 64, 1, 0, 11),
      Row("perftest", "send_lat", 4096, 1, 0, 5),  // another size: no counterpart
  }));
  REQUIRE(ratios.size() == 8);
  CHECK_FALSE(ratios[0].available);
  CHECK(ratios[0].missing == "no perftest rows for send_lat 64 B, in_flight 1, 1x1");
  CHECK(ratios[1].missing == "no zrpc rows for put_registered");
  CHECK(ratios[2].missing == "no zrpc rows for put");
  CHECK(ratios[3].missing == "no perftest rows for send_bw_bidir 64 B, 1x1");
  CHECK(ratios[4].missing == "no zrpc rows for echo_event with in_flight 1");
  CHECK(ratios[5].missing == "no zrpc rows for echo_blocking_event with in_flight 1");
  CHECK(ratios[6].missing == "no zrpc rows for stream");
  CHECK(ratios[7].missing == "no grpc rows for echo 64 B, in_flight 1, 1x1");
  const std::string text = FormatRatios(ratios);
  CHECK(text.find("n/a (no zrpc rows for put_registered)") != std::string::npos);
  CHECK(text.find("met") == std::string::npos);

  CHECK(ComputeRatios({})[0].missing == "no zrpc rows for echo with in_flight 1");
}

TEST_CASE("layer ratios split zrpc's cost into transport and RPC layer, without targets",
          "[report][ratios]") {
  std::vector<WorkloadResult> rs = {
      Row("zrpc", "echo", 64, 1, 0, 30),                // round trip 30 us
      Row("transport", "echo", 64, 1, 0, 12),           // 12 us: the RPC layer is 2.5x
      Row("perftest", "send_lat", 64, 1, 0, 5),         // one-way 5: the transport is 1.2x
      Row("zrpc", "echo", 64, 32, 0, 40),               // 800k calls/s
      Row("transport", "echo", 64, 32, 0, 20),          // 1.6M msg/s: 0.5
      Row("perftest", "send_bw_bidir", 64, 32, 0, 8),   // 4M msg/s both ways: 0.8
      Row("transport", "echo_event", 64, 1, 0, 40),     // event mode, round trip 40 us
      Row("perftest", "send_lat_event", 64, 1, 0, 10),  // one-way 10 with -e: 2.0
      Row("zrpc", "echo_event", 64, 1, 0, 60),          // 60 / 40 = 1.5
  };
  // No transport rows: no layer figures at all (the targets still show).
  CHECK(ComputeLayerRatios(MustAggregate({rs[0], rs[2]})).empty());

  const std::vector<Ratio> layers = ComputeLayerRatios(MustAggregate(rs));
  REQUIRE(layers.size() == 6);
  CHECK(layers[0].value == Approx(1.2));
  CHECK(layers[1].value == Approx(2.5));
  CHECK(layers[2].value == Approx(0.8));
  CHECK(layers[3].value == Approx(0.5));
  CHECK(layers[3].where == "64 B, in_flight 32 vs 32, 1x1");
  CHECK(layers[4].value == Approx(2.0));
  CHECK(layers[5].value == Approx(1.5));
  CHECK(layers[5].name == "zrpc event echo p50 / transport event echo p50");
  for (const Ratio& r : layers) {
    CHECK(r.available);
    CHECK_FALSE(r.has_target);
    CHECK_FALSE(r.met);
  }
  const std::string text = FormatRatios(layers);
  CHECK(text.find("target") == std::string::npos);
  CHECK(text.find("MISSED") == std::string::npos);
  CHECK(text.find("zrpc echo p50 / transport echo p50") != std::string::npos);
  const std::string json = ToJsonDocument(MustAggregate(rs), layers);
  CHECK(json.find("\"target\":null") != std::string::npos);
  CHECK(json.find("\"met\":true") == std::string::npos);
  CHECK(json.find("\"met\":false") == std::string::npos);
}

TEST_CASE("a run becomes a row: configuration kept, figures derived per call", "[report][row]") {
  RunMeasurement run;
  run.latencies_ns = {3000, 1000, 2000, 4000};  // four calls
  run.elapsed = absl::Milliseconds(2);
  run.payload_bytes = 4 << 20;
  run.client_cpu_ns = 8000;
  run.note = "n";
  const WorkloadResult row = MakeRow({"transport", "echo", 64, 8, 1, 2, 3}, std::move(run));
  CHECK(row.system == "transport");
  CHECK(row.workload == "echo");
  CHECK(row.size == 64);
  CHECK(row.in_flight == 8);
  CHECK(row.connections == 2);
  CHECK(row.round == 3);
  CHECK(row.calls == 4);
  CHECK(row.calls_per_sec == Approx(2000));
  CHECK(row.goodput_mib_per_sec == Approx(2000));
  CHECK(row.client_cpu_us_per_call == Approx(2));
  CHECK(row.server_cpu_us_per_call == -1);  // not measured
  CHECK(row.max_us == Approx(4));
  // 10 us of latency over 2 ms: 0.005 calls in flight on average, of the 8 asked for.
  CHECK(row.note == "n; kept 0.0 of 8 calls in flight on average");
  CHECK(FormatRow(row).find("echo") == 0);
}

TEST_CASE("a row says when its run kept less of its window in flight than it asked for",
          "[report][row]") {
  // Four calls of 1.05 ms each over 1 ms: 4.2 in flight on average, against a window of 4 or 5
  // (more than 80 % of it: kept), or 6 (not).
  const int window = GENERATE(4, 5, 6);
  RunMeasurement run;
  run.latencies_ns = {1050000, 1050000, 1050000, 1050000};
  run.elapsed = absl::Milliseconds(1);
  const WorkloadResult row = MakeRow({"zrpc", "echo", 64, window, 1, 1, 0}, std::move(run));
  INFO("window " << window << ": " << row.note);
  if (window < 6) {
    CHECK(row.note.empty());
  } else {
    CHECK(row.note == "kept 4.2 of 6 calls in flight on average");
  }
  // One call at a time is left alone: the gap between two calls is the caller's own.
  RunMeasurement one;
  one.latencies_ns = {1000};
  one.elapsed = absl::Milliseconds(1);
  CHECK(MakeRow({"zrpc", "echo", 64, 1, 1, 1, 0}, std::move(one)).note.empty());
  // So is a run whose in_flight is no window it fills (a stream's reads, blocking callers).
  RunMeasurement stream;
  stream.latencies_ns = {1000};
  stream.elapsed = absl::Milliseconds(1);
  stream.keeps_window = false;
  CHECK(MakeRow({"zrpc", "stream", 64, 32, 1, 1, 0}, std::move(stream)).note.empty());
}

TEST_CASE("rounds merged keep each part of their notes once", "[report][row]") {
  WorkloadResult a = Row("zrpc", "echo", 64, 8, 0, 11);
  WorkloadResult b = Row("zrpc", "echo", 64, 8, 1, 12);
  a.note = "server CPU not measured; kept 5.0 of 8 calls in flight on average";
  b.note = "server CPU not measured; kept 6.0 of 8 calls in flight on average";
  const std::vector<Aggregate> merged = MustAggregate({a, b});
  REQUIRE(merged.size() == 1);
  CHECK(merged[0].median.note ==
        "server CPU not measured; kept 5.0 of 8 calls in flight on average; kept 6.0 of 8 "
        "calls in flight on average");
}

TEST_CASE("the table has one fixed-width line per configuration", "[report][table]") {
  WorkloadResult r = Row("zrpc", "echo", 64, 1, 0, 11);
  r.client_cpu_us_per_call = 1.5;
  const std::string table =
      FormatTable(MustAggregate({r, Row("perftest", "send_lat", 64, 1, 0, 5)}));
  std::vector<std::string> lines;
  for (size_t start = 0, end; (end = table.find('\n', start)) != std::string::npos;
       start = end + 1) {
    lines.push_back(table.substr(start, end - start));
  }
  REQUIRE(lines.size() == 4);  // header, two rows, the footnote
  CHECK(lines[0].size() == lines[1].size());
  CHECK(lines[1].size() == lines[2].size());
  CHECK(lines[1].find("11.00") != std::string::npos);
  CHECK(lines[1].find("1.50/-") != std::string::npos);
  // Right-aligned columns: the p50 header and value end in the same column.
  CHECK(lines[0].find("p50_us") + 6 == lines[1].find("11.00") + 5);
}

}  // namespace
}  // namespace zrpc::bench
