#!/usr/bin/env bash
# grpc_bench, the gRPC baseline, on the host over TCP (no device): a server on 127.0.0.1 with a
# kernel-chosen port, a short client run whose JSON Lines bench_report can read, a clean exit on
# SIGTERM, and exit status 2 for command lines it does not take.
set -uo pipefail
runfiles="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE}"
source "$runfiles/tests/junit.sh"
source "$runfiles/tests/benchmarks/usage_errors.sh"
junit_init grpc_bench_test
bench="$runfiles/benchmarks/grpc_bench"
report="$runfiles/benchmarks/bench_report"
tmp="${TEST_TMPDIR:-/tmp}/grpc_bench_test"
rm -rf "$tmp"
mkdir -p "$tmp"
server=""
trap '[[ -z "$server" ]] || kill "$server" 2>/dev/null || true' EXIT

echo_runs() {
  "$bench" server --listen 127.0.0.1:0 >"$tmp/server.out" 2>"$tmp/server.err" &
  server=$!
  local i target=""
  for ((i = 0; i < 300; i++)); do
    target=$(awk '/^listening / { print $2; exit }' "$tmp/server.out")
    [[ -n "$target" ]] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  if [[ ! "$target" =~ ^127\.0\.0\.1:[1-9][0-9]*$ ]]; then
    junit_problem "server printed no \"listening 127.0.0.1:PORT\": $(cat "$tmp/server.out" "$tmp/server.err")"
    return
  fi
  local json=$tmp/grpc.jsonl
  if ! "$bench" client --connect "$target" --calls 200 --warmup 10 --size 64 --in-flight 1,4 \
      --round 1 --json "$json" >"$tmp/client.out" 2>&1; then
    junit_problem "client failed: $(cat "$tmp/client.out")"
  fi
  cat "$tmp/client.out"
  [[ $(grep -c '^echo ' "$tmp/client.out") == 2 ]] || junit_problem "want 2 rows printed"
  [[ $(wc -l <"$json") == 2 ]] || junit_problem "want 2 JSON lines, got $(wc -l <"$json")"
  [[ $(grep -c '^{"system":"grpc","workload":"echo","size":64,' "$json") == 2 ]] ||
    junit_problem "want 2 lines of system grpc, workload echo, size 64"
  [[ $(grep -c '"calls":200,' "$json") == 2 ]] || junit_problem "want calls 200 on both lines"
  grep -q '"in_flight":1,' "$json" && grep -q '"in_flight":4,' "$json" ||
    junit_problem "want in_flight 1 and 4"
  grep -q '"server_cpu_us_per_call":-1' "$json" && junit_problem "server CPU not measured"
  # bench_report reads them as gRPC rows.
  "$report" "$json" >"$tmp/report.out" 2>&1 || junit_problem "bench_report failed: $(cat "$tmp/report.out")"
  grep -q '^grpc' "$tmp/report.out" || junit_problem "no grpc row in bench_report's table: $(cat "$tmp/report.out")"
  kill -TERM "$server"
  local rc=0
  wait "$server" || rc=$?
  server=""
  ((rc == 0)) || junit_problem "server exited $rc on SIGTERM: $(cat "$tmp/server.err")"
}

argument_errors() {
  expect_help "$bench" grpc_bench
  expect_usage_errors "$bench" grpc_bench "" "server" "server --listen nocolon" \
    "server --listen 127.0.0.1:0 --pollers 2" "client" \
    "client --connect 127.0.0.1:1 --workload put" "client --connect 127.0.0.1:1 --connections 2" \
    "client --connect 127.0.0.1:1 --threads 2" "client --connect 127.0.0.1:1 --size x" \
    "client --connect 127.0.0.1:1 --bogus 1"
}

junit_scenario "server on 127.0.0.1:0, client at 1 and 4 in flight, SIGTERM" echo_runs
junit_scenario "argument errors exit 2" argument_errors
junit_finish
