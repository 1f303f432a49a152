// ParsePrometheusText: a strict parser of Prometheus text exposition format 0.0.4, for tests that
// read zrpc's metrics back (rpc/metrics.h) and check what a scraper would see.
//
// It returns every sample, keyed by its series as written: the metric name, then the labels in
// the order they appear, values escaped again the canonical way:
//
//     zrpc_calls_started_total{side="client",method="pkg.Svc/Get"}        -> 3
//     zrpc_call_latency_seconds_bucket{side="client",method="pkg.Svc/Get",le="+Inf"} -> 3
//     up                                                                  -> 1  (no labels)
//
// It refuses (kInvalidArgument, naming the line number) anything Prometheus would refuse and a
// few things it tolerates but zrpc never writes:
//  - a malformed line: bad metric or label name, unterminated or unknown label escape, a
//    duplicate label, a value that is not a float (+Inf, -Inf, NaN allowed), trailing tokens
//    beyond an integer timestamp; text not ending in a newline;
//  - a duplicate series;
//  - a sample whose family has no `# TYPE` before it (zrpc declares every family), `# HELP` or
//    `# TYPE` given twice or after the family's first sample, a family whose lines are not one
//    contiguous group, an unknown type;
//  - a negative or NaN counter;
//  - a histogram series group (same labels but `le`) whose `_bucket` samples lack `le`, lack the
//    `le="+Inf"` bucket, are not cumulative (counts must not decrease as `le` grows), or whose
//    `+Inf` bucket differs from its `_count` or has no `_count`.
#ifndef ZRPC_TESTS_RPC_PROMETHEUS_PARSE_H_
#define ZRPC_TESTS_RPC_PROMETHEUS_PARSE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zrpc::testing {

absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(absl::string_view text);

}  // namespace zrpc::testing

#endif  // ZRPC_TESTS_RPC_PROMETHEUS_PARSE_H_
