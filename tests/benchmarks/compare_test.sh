#!/usr/bin/env bash
# A short real run of the comparison tools/bench runs (benchmarks/compare.sh): one round, few
# calls, on the harness's device: zrpc, its transport alone, perftest and gRPC. It checks the machinery, not the figures: every program
# produced its rows, bench_report merged them, printed the ratios (met, MISSED or n/a, never a
# blank) and wrote the JSON summary and the SVG.
set -uo pipefail
runfiles="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE}"
source "$runfiles/tests/junit.sh"
junit_init compare_test
junit_require_device "zrpc_bench, perftest and bench_report in one round"
out="${TEST_TMPDIR:-/tmp}/compare_test"
rm -rf "$out"

one_round() {
  if ! "$runfiles/benchmarks/compare.sh" "$runfiles/benchmarks/zrpc_bench" \
      "$runfiles/benchmarks/transport_bench" "$runfiles/benchmarks/grpc_bench" "$runfiles/benchmarks/bench_report" "$out" --rounds 1 --calls 300 --in-flight 8 \
      --bulk-size 65536 >"$out.log" 2>&1; then
    junit_problem "compare.sh failed: $(tail -n 20 "$out.log")"
    return
  fi
  cat "$out.log"
  local workload
  for workload in echo put put_registered stream; do
    grep -q "\"system\":\"zrpc\",\"workload\":\"$workload\"" "$out/results.jsonl" ||
      junit_problem "no zrpc $workload row in results.jsonl"
  done
  [[ $(grep -c '"system":"zrpc","workload":"echo"' "$out/results.jsonl") == 2 ]] ||
    junit_problem "want 2 zrpc echo rows (1 and 8 in flight)"
  grep '"system":"perftest","workload":"send_bw"' "$out/results.jsonl" | grep -q '"size":4096,' ||
    junit_problem "no perftest send_bw row at the stream's 4096 B"
  grep -q 'zrpc stream msg/s / perftest send_bw msg/s .*[0-9]\.[0-9]' "$out.log" ||
    junit_problem "no stream ratio with a value"
  [[ $(grep -c '"system":"grpc","workload":"echo"' "$out/results.jsonl") == 2 ]] ||
    junit_problem "want 2 grpc echo rows (1 and 8 in flight)"
  [[ $(grep -c '"system":"transport","workload":"echo"' "$out/results.jsonl") == 2 ]] ||
    junit_problem "want 2 transport echo rows (1 and 8 in flight)"
  grep -q '"system":"zrpc","workload":"echo_event"' "$out/results.jsonl" ||
    junit_problem "no zrpc echo_event row (event mode) in results.jsonl"
  grep -q '"system":"zrpc","workload":"echo_blocking_event"' "$out/results.jsonl" ||
    junit_problem "no zrpc echo_blocking_event row (the default configuration) in results.jsonl"
  grep -q '"system":"transport","workload":"echo_event"' "$out/results.jsonl" ||
    junit_problem "no transport echo_event row (event mode) in results.jsonl"
  grep -q 'zrpc default-config echo p50 / zrpc event echo p50 .*[0-9]\.[0-9]' "$out.log" ||
    junit_problem "no default-configuration ratio with a value"
  for workload in send_lat send_lat_event send_bw send_bw_bidir write_bw; do
    grep -q "\"system\":\"perftest\",\"workload\":\"$workload\"" "$out/results.jsonl" ||
      junit_problem "no perftest $workload row in results.jsonl"
  done
  for workload in send_lat send_lat_event; do
    grep "\"system\":\"perftest\",\"workload\":\"$workload\"" "$out/results.jsonl" |
      grep -q '"p90_us":[0-9][^,]*,.*"cdf_us":\[[0-9]' ||
      junit_problem "the perftest $workload row has no latency distribution (-H): p90_us, cdf_us"
  done
  grep -q '^== ratios' "$out.log" || junit_problem "no ratios block"
  [[ $(grep -cE 'target (<=|>=) [0-9.]+ +(met|MISSED)|n/a \(' "$out.log") -ge 4 ]] ||
    junit_problem "fewer than 4 ratio lines with a verdict"
  grep -q "^== where zrpc's cost over perftest arises" "$out.log" ||
    junit_problem "no layer block (transport vs perftest, zrpc vs transport)"
  [[ $(sed -n "/^== where zrpc's cost/,\$p" "$out.log" | grep -cE ' [0-9]+\.[0-9]{3} \([0-9.]+-[0-9.]+, 1 rd\)') == 6 ]] ||
    junit_problem "want 6 layer ratios with a value (busy and event mode)"
  grep -q '"ratios"' "$out/summary.json" || junit_problem "summary.json has no ratios"
  grep -q '<svg' "$out/latency_cdf.svg" && grep -q '<polyline' "$out/latency_cdf.svg" ||
    junit_problem "latency_cdf.svg has no curve"
}

junit_scenario "zrpc_bench, perftest and bench_report in one round" one_round
junit_finish
