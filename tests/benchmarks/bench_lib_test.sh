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

# perftest_run with a stand-in perftest on PATH (a bash program named ib_send_lat): `fails_until`
# holds how many more runs fail (print nothing and exit 1, as a hang cut by `timeout` does);
# after that both sides print a result line.
perftest_stand_in() {
  mkdir -p "$tmp/bin"
  cat >"$tmp/bin/ib_send_lat" <<'STAND_IN'
#!/usr/bin/env bash
# Both sides of a run count as one: only the client (the call with the address last) decides.
[[ "${*: -1}" == 10.0.0.1 ]] || exit 0
n=$(cat "$STAND_IN_STATE")
if ((n > 0)); then
  echo $((n - 1)) >"$STAND_IN_STATE"
  exit 1
fi
printf ' #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec] 99%% 99.9%%\n'
printf ' 64 1000 5.00 90.00 6.50 7.00 1.00 20.00 80.00\n'
STAND_IN
  chmod +x "$tmp/bin/ib_send_lat"
}

# run_perftest FAILURES: perftest_run of the stand-in that fails FAILURES times first, then the
# row perftest_json-style reading makes of its log: prints the script's output and "row=LINE".
run_perftest() {
  perftest_stand_in
  echo "$1" >"$tmp/state"
  rm -f "$tmp/missing.txt"
  in_script "export PATH='$tmp/bin':\$PATH STAND_IN_STATE='$tmp/state' PERFTEST_LAT_TIMEOUT=5; \
    ZRPC_RDMA_DEVICE=rxe0 ZRPC_RDMA_GID_INDEX=1 ZRPC_RDMA_ADDR=10.0.0.1 out='$tmp' round=3; \
    perftest_run ib_send_lat send_lat -s 64 -n 1000; echo \"row=\$(data_line '$tmp/send_lat.client')\""
}

perftest_retried_then_used() {
  local out
  out=$(run_perftest 3)
  [[ $(grep -c "running it again" <<<"$out") == 3 ]] || junit_problem "want 3 retries: $out"
  grep -q "^row= 64 1000 5.00" <<<"$out" || junit_problem "the 4th run's line is not read: $out"
  ! grep -q MISSING <<<"$out" || junit_problem "a row that came is called missing: $out"
  [[ ! -s "$tmp/missing.txt" ]] || junit_problem "missing.txt written: $(cat "$tmp/missing.txt")"
}

# Five failures in a row (CI of 2026-11-29's tools/bench: ib_send_lat -e hung five times in one
# round, and the whole run stopped): the round goes on without the row, and says so.
perftest_missing_row_said_and_skipped() {
  local out rc
  out=$(run_perftest 5)
  rc=$?
  ((rc == 0)) || junit_problem "exit status $rc, expected the script to go on: $out"
  [[ $(grep -c "running it again" <<<"$out") == 5 ]] || junit_problem "want 5 attempts: $out"
  grep -q "== MISSING: perftest ib_send_lat .* failed 5 times in round 3: no send_lat row" <<<"$out" ||
    junit_problem "no MISSING line: $out"
  grep -qx "row=" <<<"$out" || junit_problem "a row was read from a failed run: $out"
  grep -q "failed 5 times in round 3" "$tmp/missing.txt" 2>/dev/null ||
    junit_problem "missing.txt does not say it"
}

junit_scenario "start_server never takes the address from an earlier server's log" stale_log_never_read
junit_scenario "a server that dies before listening stops the script with its stderr" dead_server_reported
junit_scenario "a listening line without a port stops the script with that line" malformed_line_refused
junit_scenario "a server that fails on SIGTERM stops the script with its stderr" failing_stop_reported
junit_scenario "perftest_run tries a failing perftest again and uses the first good run" perftest_retried_then_used
junit_scenario "perftest_run after five failures leaves the row out, says so, and lets the round go on" perftest_missing_row_said_and_skipped
junit_finish
