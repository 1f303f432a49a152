#!/usr/bin/env bash
# benchmarks/bench_lib.sh on the host, with stand-in servers (small bash programs): start_server
# takes the address only from the server it started, never from the log of an earlier server of
# the same name; a server that dies before listening, or never listens, or fails on SIGTERM,
# stops the script with the reason.
#
# The first case is the CI failure of 2026-11-24 (compare_test: "zrpc_server did not start"):
# the earlier server's "listening" line was still in the log when the script first looked. That
# interleaving could not be forced here (a background child's truncation of its log almost
# always comes first); the case runs start_server 40 times over a stale log with a server that
# answers late, so a regression shows as a wrong or missing address.
set -uo pipefail
runfiles="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE}"
source "$runfiles/tests/junit.sh"
junit_init bench_lib_test
lib="$runfiles/benchmarks/bench_lib.sh"
tmp="${TEST_TMPDIR:-/tmp}/bench_lib_test"
rm -rf "$tmp"
mkdir -p "$tmp"

# in_script CMDS: runs CMDS in a fresh bash that has sourced the library, under the options
# compare.sh and ab.sh set; prints its stdout and stderr, returns its status.
in_script() {
  bash -c "set -euo pipefail; logs='$tmp'; source '$lib'; $1" 2>&1
}

late_server='sleep 0.2; echo "listening 10.0.0.1:7"; exec sleep 30'

stale_log_never_read() {
  local i out
  for ((i = 0; i < 40; i++)); do
    echo "listening 10.9.9.9:1" >"$tmp/fake.out"
    out=$(in_script "start_server fake bash -c '$late_server'; echo \"target=\$target\"; stop_server fake")
    # stop_server fails: SIGTERM kills the stand-in (status 143); only the target matters here.
    if ! grep -qx 'target=10.0.0.1:7' <<<"$out"; then
      junit_problem "run $i: expected target=10.0.0.1:7, got: $out"
      return
    fi
  done
}

# expect_stop CMDS MESSAGE...: CMDS, then `echo reached`, must exit 1 before reaching it, and
# print every MESSAGE.
expect_stop() {
  local cmds=$1 out rc message
  shift
  out=$(in_script "$cmds; echo reached")
  rc=$?
  ((rc == 1)) || junit_problem "exit status $rc, expected 1: $out"
  ! grep -q reached <<<"$out" || junit_problem "the script went on: $out"
  for message in "$@"; do
    grep -qF "$message" <<<"$out" || junit_problem "no \"$message\" in: $out"
  done
}

dead_server_reported() {
  expect_stop "start_server fake bash -c 'echo cannot bind >&2; exit 3'" "cannot bind"
}

malformed_line_refused() {
  expect_stop "start_server fake bash -c 'echo listening nowhere; exec sleep 30'" \
    "it printed: listening nowhere"
}

failing_stop_reported() {
  expect_stop "start_server fake bash -c 'trap \"echo torn down badly >&2; exit 4\" TERM; echo listening 10.0.0.1:7; while :; do sleep 0.1; done'; stop_server fake" \
    "fake failed" "torn down badly"
}

junit_scenario "start_server never takes the address from an earlier server's log" stale_log_never_read
junit_scenario "a server that dies before listening stops the script with its stderr" dead_server_reported
junit_scenario "a listening line without a port stops the script with that line" malformed_line_refused
junit_scenario "a server that fails on SIGTERM stops the script with its stderr" failing_stop_reported
junit_finish
