// ComputeRatios, FormatTable and FormatRatios: what bench_report prints.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/report.h"

namespace zrpc::bench {
namespace {

// Which depth of a configuration a ratio compares: latency at in_flight 1, throughput at the
// deepest queue each side measured.
enum class Depth { kOne, kLargest };

// The rows of system/workload that a ratio may use: those at in_flight 1 (kOne), or per
// (size, threads, connections) the one with the largest in_flight (kLargest).
std::vector<const Aggregate*> Rows(const std::vector<Aggregate>& aggregates,
                                   absl::string_view system, absl::string_view workload,
                                   Depth depth) {
  std::vector<const Aggregate*> rows;
  std::map<std::tuple<uint64_t, int, int>, size_t> deepest;  // config -> index in rows
  for (const Aggregate& a : aggregates) {
    const WorkloadResult& r = a.median;
    if (r.system != system || r.workload != workload) continue;
    if (depth == Depth::kOne) {
      if (r.in_flight == 1) rows.push_back(&a);
      continue;
    }
    const auto [it, inserted] =
        deepest.emplace(std::make_tuple(r.size, r.threads, r.connections), rows.size());
    if (inserted) {
      rows.push_back(&a);
    } else if (r.in_flight > rows[it->second]->median.in_flight) {
      rows[it->second] = &a;
    }
  }
  return rows;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

struct Spec {
  const char* name;
  const char* subject_system;  // the numerator's system: zrpc, or a layer of it
  const char* zrpc_workload;
  const char* other_system;
  const char* other_workload;
  Depth depth;
  double target;  // NaN: a layer figure, no target
  bool higher_is_better;
  double (*value)(const WorkloadResult& zrpc, const WorkloadResult& other);
};

const Spec kSpecs[] = {
    {"zrpc echo p50 / (2 x perftest send_lat p50)", "zrpc", "echo", "perftest", "send_lat",
     Depth::kOne, 1.15, false,
     // perftest's send_lat p50 is one-way: twice it is the round trip zrpc's echo measures.
     [](const WorkloadResult& z, const WorkloadResult& o) { return z.p50_us / (2 * o.p50_us); }},
    // Payloads from registered memory, sent with no copy: the target. Staged ones (copied once
    // into registered memory first) are a figure beside it.
    {"zrpc registered put MiB/s / perftest write_bw MiB/s", "zrpc", "put_registered", "perftest",
     "write_bw", Depth::kLargest, 0.95, true,
     [](const WorkloadResult& z, const WorkloadResult& o) {
       return z.goodput_mib_per_sec / o.goodput_mib_per_sec;
     }},
    {"zrpc staged put MiB/s / perftest write_bw MiB/s", "zrpc", "put", "perftest", "write_bw",
     Depth::kLargest, NAN, true,
     [](const WorkloadResult& z, const WorkloadResult& o) {
       return z.goodput_mib_per_sec / o.goodput_mib_per_sec;
     }},
    // An echo against an echo: perftest's bidirectional send_bw (-b) streams both ways at once
    // and reports the two directions' messages summed, so half its rate is a rate of exchanges,
    // as a call (one message each way) is. One-way send_bw would flatter perftest by 2x.
    {"zrpc echo calls/s / (perftest send_bw -b msg/s / 2)", "zrpc", "echo", "perftest",
     "send_bw_bidir", Depth::kLargest, 0.9, true,
     [](const WorkloadResult& z, const WorkloadResult& o) {
       return z.calls_per_sec / (o.calls_per_sec / 2);
     }},
    // What users get out of the box: both sides' pollers sleep in event mode (the default), so
    // each message costs a completion interrupt and a wake-up, as in perftest's -e.
    {"zrpc event echo p50 / (2 x perftest send_lat -e p50)", "zrpc", "echo_event", "perftest",
     "send_lat_event", Depth::kOne, 1.3, false,
     [](const WorkloadResult& z, const WorkloadResult& o) { return z.p50_us / (2 * o.p50_us); }},
    // Where users live (blocking stub, handlers on the pool, event mode: zrpc's defaults) against
    // the benchmark's configuration in the same poll mode (async calls chained from callbacks,
    // inline handlers): what the thread hand-offs cost.
    {"zrpc default-config echo p50 / zrpc event echo p50", "zrpc", "echo_blocking_event", "zrpc",
     "echo_event", Depth::kOne, 1.5, false,
     [](const WorkloadResult& d, const WorkloadResult& e) { return d.p50_us / e.p50_us; }},
    // One stream's messages against perftest's SENDs of the same size (a figure: the issue
    // that added streams set no target).
    {"zrpc stream msg/s / perftest send_bw msg/s", "zrpc", "stream", "perftest", "send_bw",
     Depth::kLargest, NAN, true,
     [](const WorkloadResult& z, const WorkloadResult& o) {
       return z.calls_per_sec / o.calls_per_sec;
     }},
    {"grpc echo p50 / zrpc echo p50", "zrpc", "echo", "grpc", "echo", Depth::kOne, 20, true,
     [](const WorkloadResult& z, const WorkloadResult& o) { return o.p50_us / z.p50_us; }},
};

// Where zrpc's cost over perftest arises: the transport alone (transport_bench) against perftest,
// and the RPC layer against the transport, like for like.
const Spec kLayerSpecs[] = {
    {"transport echo p50 / (2 x perftest send_lat p50)", "transport", "echo", "perftest",
     "send_lat", Depth::kOne, NAN, false,
     [](const WorkloadResult& t, const WorkloadResult& o) { return t.p50_us / (2 * o.p50_us); }},
    {"zrpc echo p50 / transport echo p50", "zrpc", "echo", "transport", "echo", Depth::kOne, NAN,
     false, [](const WorkloadResult& z, const WorkloadResult& t) { return z.p50_us / t.p50_us; }},
    {"transport echo msg/s / (perftest send_bw -b msg/s / 2)", "transport", "echo", "perftest",
     "send_bw_bidir", Depth::kLargest, NAN, true,
     [](const WorkloadResult& t, const WorkloadResult& o) {
       return t.calls_per_sec / (o.calls_per_sec / 2);
     }},
    {"zrpc echo calls/s / transport echo msg/s", "zrpc", "echo", "transport", "echo",
     Depth::kLargest, NAN, true,
     [](const WorkloadResult& z, const WorkloadResult& t) {
       return z.calls_per_sec / t.calls_per_sec;
     }},
    // Event mode, split the same way: both sides' pollers sleep when idle.
    {"transport event echo p50 / (2 x perftest send_lat -e p50)", "transport", "echo_event",
     "perftest", "send_lat_event", Depth::kOne, NAN, false,
     [](const WorkloadResult& t, const WorkloadResult& o) { return t.p50_us / (2 * o.p50_us); }},
    {"zrpc event echo p50 / transport event echo p50", "zrpc", "echo_event", "transport",
     "echo_event", Depth::kOne, NAN, false,
     [](const WorkloadResult& z, const WorkloadResult& t) { return z.p50_us / t.p50_us; }},
};

std::string Config(const WorkloadResult& r) { return absl::StrCat(r.threads, "x", r.connections); }

template <size_t N>
std::vector<Ratio> Compute(const std::vector<Aggregate>& aggregates, const Spec (&specs)[N]) {
  std::vector<Ratio> ratios;
  for (const Spec& spec : specs) {
    Ratio base;
    base.name = spec.name;
    base.has_target = !std::isnan(spec.target);
    base.target = base.has_target ? spec.target : 0;
    base.higher_is_better = spec.higher_is_better;
    const std::vector<const Aggregate*> zrpc_rows =
        Rows(aggregates, spec.subject_system, spec.zrpc_workload, spec.depth);
    if (zrpc_rows.empty()) {
      base.missing = absl::StrCat("no ", spec.subject_system, " rows for ", spec.zrpc_workload,
                                  spec.depth == Depth::kOne ? " with in_flight 1" : "");
      ratios.push_back(base);
      continue;
    }
    const std::vector<const Aggregate*> other_rows =
        Rows(aggregates, spec.other_system, spec.other_workload, spec.depth);
    for (const Aggregate* z_agg : zrpc_rows) {
      const WorkloadResult* z = &z_agg->median;
      Ratio ratio = base;
      const WorkloadResult* other = nullptr;
      const Aggregate* other_agg = nullptr;
      for (const Aggregate* o_agg : other_rows) {
        const WorkloadResult* o = &o_agg->median;
        if (o->size == z->size && o->threads == z->threads && o->connections == z->connections) {
          other = o;
          other_agg = o_agg;
        }
      }
      if (other == nullptr) {
        ratio.where = absl::StrCat(z->size, " B, in_flight ", z->in_flight, ", ", Config(*z));
        ratio.missing =
            absl::StrCat("no ", spec.other_system, " rows for ", spec.other_workload, " ", z->size,
                         " B", spec.depth == Depth::kOne ? ", in_flight 1" : "", ", ", Config(*z));
        ratios.push_back(ratio);
        continue;
      }
      ratio.where = spec.depth == Depth::kOne
                        ? absl::StrCat(z->size, " B, in_flight 1, ", Config(*z))
                        : absl::StrCat(z->size, " B, in_flight ", z->in_flight, " vs ",
                                       other->in_flight, ", ", Config(*z));
      // The ratio within each round both sides ran, then its median and spread.
      std::vector<double> per_round;
      for (const WorkloadResult& zr : z_agg->runs) {
        for (const WorkloadResult& orr : other_agg->runs) {
          if (orr.round != zr.round) continue;
          const double v = spec.value(zr, orr);
          if (std::isfinite(v)) per_round.push_back(v);
        }
      }
      double value = spec.value(*z, *other);
      if (!per_round.empty()) {
        value = Median(per_round);
        ratio.rounds = static_cast<int>(per_round.size());
        ratio.min = *std::min_element(per_round.begin(), per_round.end());
        ratio.max = *std::max_element(per_round.begin(), per_round.end());
      }
      if (!std::isfinite(value)) {
        ratio.missing = "a figure is zero or not a number";
      } else {
        ratio.available = true;
        ratio.value = value;
        ratio.met = ratio.has_target &&
                    (spec.higher_is_better ? value >= spec.target : value <= spec.target);
      }
      ratios.push_back(ratio);
    }
  }
  return ratios;
}

}  // namespace

std::vector<Ratio> ComputeRatios(const std::vector<Aggregate>& aggregates) {
  return Compute(aggregates, kSpecs);
}

std::vector<Ratio> ComputeLayerRatios(const std::vector<Aggregate>& aggregates) {
  for (const Aggregate& a : aggregates) {
    if (a.median.system == "transport") return Compute(aggregates, kLayerSpecs);
  }
  return {};
}

std::string FormatTable(const std::vector<Aggregate>& aggregates) {
  constexpr char kRow[] = "%-9s %-9s %8s %9s %7s %9s %9s %9s %9s %9s %11s %9s %15s %6s\n";
  std::string out = absl::StrFormat(kRow, "system", "workload", "size", "in_flight", "thr x c",
                                    "p50_us", "p90_us", "p99_us", "p99.9_us", "max_us", "calls/s",
                                    "MiB/s", "cpu_us cli/srv", "rounds");
  // "-" for a figure not measured: a negative CPU figure, or NaN (null in the JSON) anywhere.
  auto cpu = [](double v) {
    return v < 0 || std::isnan(v) ? std::string("-") : absl::StrFormat("%.2f", v);
  };
  auto fig = [](const char* format, double v) {
    return std::isnan(v) ? std::string("-") : absl::StrFormat(format, v);
  };
  for (const Aggregate& a : aggregates) {
    const WorkloadResult& r = a.median;
    absl::StrAppendFormat(
        &out, kRow, r.system, r.workload, absl::StrCat(r.size), absl::StrCat(r.in_flight),
        Config(r), fig("%.2f", r.p50_us), fig("%.2f", r.p90_us), fig("%.2f", r.p99_us),
        fig("%.2f", r.p999_us), fig("%.2f", r.max_us), fig("%.0f", r.calls_per_sec),
        fig("%.1f", r.goodput_mib_per_sec),
        absl::StrCat(cpu(r.client_cpu_us_per_call), "/", cpu(r.server_cpu_us_per_call)),
        absl::StrCat(a.rounds));
  }
  out +=
      "Medians across rounds. Latency: round trip for zrpc, transport and grpc, one-way for "
      "perftest send_lat.\n";
  return out;
}

std::string FormatRatios(const std::vector<Ratio>& ratios) {
  std::string out;
  for (const Ratio& r : ratios) {
    const std::string where = r.where.empty() ? "" : absl::StrCat("[", r.where, "]");
    if (!r.available) {
      absl::StrAppendFormat(&out, "%-45s %-37s n/a (%s)\n", r.name, where, r.missing);
      continue;
    }
    // The spread across rounds: a change is real only when its medians differ by more.
    const std::string spread = r.rounds > 0
                                   ? absl::StrFormat("(%.3f-%.3f, %d rd)", r.min, r.max, r.rounds)
                                   : std::string("(of medians)");
    if (!r.has_target) {
      absl::StrAppendFormat(&out, "%-48s %-34s %8.3f %-22s\n", r.name, where, r.value, spread);
      continue;
    }
    absl::StrAppendFormat(&out, "%-45s %-37s %8.3f %-22s target %s %.2f  %s\n", r.name, where,
                          r.value, spread, r.higher_is_better ? ">=" : "<=", r.target,
                          r.met ? "met" : "MISSED");
  }
  return out;
}

}  // namespace zrpc::bench
