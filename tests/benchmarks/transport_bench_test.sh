#!/usr/bin/env bash
# transport_bench's command line, on the host (no device): every flag it does not take, or takes
# wrongly, exits 2 with its usage before it opens a device. Its real runs are compare_test's
# (tests/benchmarks/compare_test.sh, on the harness's device).
set -uo pipefail
runfiles="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE}"
source "$runfiles/tests/junit.sh"
source "$runfiles/tests/benchmarks/usage_errors.sh"
junit_init transport_bench_test
bench="$runfiles/benchmarks/transport_bench"
tmp="${TEST_TMPDIR:-/tmp}/transport_bench_test"
rm -rf "$tmp"
mkdir -p "$tmp"

argument_errors() {
  expect_help "$bench" transport_bench
  expect_usage_errors "$bench" transport_bench "" "bogus" "server" "server --listen nocolon" \
    "server --listen 127.0.0.1:70000" "server --listen 127.0.0.1:0 --pollers 2" \
    "server --listen 127.0.0.1:0 --spin 1ms" "server --listen 127.0.0.1:0 --max-bulk 4096" \
    "client" "client --connect nocolon" "client --connect 127.0.0.1:1 --workload put" \
    "client --connect 127.0.0.1:1 --connections 2" "client --connect 127.0.0.1:1 --sweep" \
    "client --connect 127.0.0.1:1 --threads 2" "client --connect 127.0.0.1:1 --duration 1" \
    "client --connect 127.0.0.1:1 --blocking" \
    "client --connect 127.0.0.1:1 --size 2" "client --connect 127.0.0.1:1 --size x" \
    "client --connect 127.0.0.1:1 --bogus 1"
}

junit_scenario "argument errors exit 2 with the usage" argument_errors
junit_finish
