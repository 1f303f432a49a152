#!/usr/bin/env bash
# The example pairs end to end on an RDMA device, as a user runs them: each server started with
# --listen ADDR:0 in the background, its port read from its "listening on" line, the clients run
# against it and their output checked, then SIGTERM, which must end the server with exit 0
# within 10 s.
#
# Tagged "rdma": tools/test runs it inside tools/softroce, which sets ZRPC_RDMA_ADDR. Without a
# device (ZRPC_RDMA_ADDR and ZRPC_SOFTROCE_MODE both unset) it is SKIPPED, loudly, and says so
# in the JUnit XML the way tests/catch_main.cc does, so tools/test counts a skip, not a pass.
set -uo pipefail
bin="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE}/examples"
tmp="${TEST_TMPDIR:-/tmp}/examples_test"
rm -rf "$tmp" && mkdir -p "$tmp"

source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/junit.sh"
junit_init examples_test
junit_require_device "the example servers and clients end to end"
host=$ZRPC_RDMA_ADDR
[[ $host == *:* ]] && host="[$host]"

server_pid=""
trap '[[ -z "$server_pid" ]] || kill -KILL "$server_pid" 2>/dev/null' EXIT

# start_server PROGRAM ARGS...: starts it in the background and sets $port from its
# "listening on ADDR:PORT" line; false (with the reason) if that line does not come in 20 s.
start_server() {
  local program=$1
  shift
  # Emptied before the fork, never left to the child's truncation: this shell's first look may
  # come before it and find the line of the server run before (benchmarks/bench_lib.sh).
  : >"$tmp/$program.out"
  : >"$tmp/$program.err"
  "$bin/$program" "$@" >"$tmp/$program.out" 2>"$tmp/$program.err" &
  server_pid=$!
  local line="" i
  for ((i = 0; i < 200; i++)); do
    line=$(grep -m 1 '^listening on ' "$tmp/$program.out")
    [[ -n "$line" ]] || ! kill -0 "$server_pid" 2>/dev/null && break
    sleep 0.1
  done
  port=${line##*:}
  echo "$program $*: ${line:-(no \"listening on\" line)}"
  if ! [[ "$port" =~ ^[1-9][0-9]*$ ]]; then
    junit_problem "$program did not print \"listening on ADDR:PORT\"; stderr: $(tail -n 5 "$tmp/$program.err")"
    kill -KILL "$server_pid" 2>/dev/null
    server_pid=""
    return 1
  fi
}

# stop_server PROGRAM: SIGTERM; it must exit 0 within 10 s.
stop_server() {
  local program=$1 i rc=0
  kill -TERM "$server_pid"
  for ((i = 0; i < 100; i++)); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$server_pid" 2>/dev/null; then
    junit_problem "$program still running 10 s after SIGTERM"
    kill -KILL "$server_pid"
  fi
  wait "$server_pid" || rc=$?
  server_pid=""
  echo "$program after SIGTERM: exit $rc: $(tail -n 1 "$tmp/$program.out")"
  [[ $rc == 0 ]] || junit_problem "$program exited $rc after SIGTERM; stderr: $(tail -n 5 "$tmp/$program.err")"
}

# run_client WANT_EXIT PROGRAM ARGS...: runs it (60 s at most); its output is in $tmp/client.*.
run_client() {
  local want=$1 program=$2 rc=0
  shift 2
  timeout 60 "$bin/$program" "$@" >"$tmp/client.out" 2>"$tmp/client.err" || rc=$?
  echo "$program $*: exit $rc"
  sed 's/^/  | /' "$tmp/client.out" "$tmp/client.err"
  [[ $rc == "$want" ]] || junit_problem "$program $* exited $rc, want $want"
}

greeter() {
  start_server greeter_server --listen "$host:0" --threads 2 || return
  run_client 0 greeter_client --connect "$host:$port" --name examples --calls 3
  local want=$'Hello, examples\nHello, examples\nHello, examples\n3 calls ok'
  [[ "$(cat "$tmp/client.out")" == "$want" ]] || junit_problem "greeter_client printed something else than 3 greetings and \"3 calls ok\""
  stop_server greeter_server
  # Nobody listens there any more: the client reports the error and exits 1.
  run_client 1 greeter_client --connect "$host:$port"
  grep -q '^greeter_client: call 1 of 1: ' "$tmp/client.err" || junit_problem "greeter_client did not print the failed call's status"
}

object_store() {
  start_server object_store_server --listen "$host:0" --arena 1M --max-bulk 4M || return
  local size
  # 1 MiB (the default: exactly the server's arena, written there), then 4 MiB (pulled by the
  # server, and exactly its --max-bulk).
  for size in 1M 4M; do
    run_client 0 object_store_client --connect "$host:$port" --size "$size"
    [[ "$(tail -n 1 "$tmp/client.out")" == ok ]] || junit_problem "object_store_client --size $size did not end with \"ok\""
    for step in put stat get transform; do
      grep -q "^$step " "$tmp/client.out" || junit_problem "object_store_client --size $size printed no \"$step\" line"
    done
  done
  # 64 bytes more than the server's --max-bulk: refused, and the client says why.
  run_client 1 object_store_client --connect "$host:$port" --size $(((4 << 20) + 64)) --name too-big
  grep -q 'RESOURCE_EXHAUSTED.*max_bulk_size' "$tmp/client.err" || junit_problem "a payload larger than the server's --max-bulk was not refused with RESOURCE_EXHAUSTED naming max_bulk_size"
  stop_server object_store_server
}

numbers() {
  start_server numbers_server --listen "$host:0" "$@" || return
  run_client 0 numbers_client --connect "$host:$port" --count 3000
  local want=$'Count: 3000 numbers in order\nSum: 3000 numbers, total 4501500\nDouble: 3000 numbers back doubled\nSquare: 7 * 7 = 49\nall calls ok'
  [[ "$(cat "$tmp/client.out")" == "$want" ]] || junit_problem "numbers_client printed something else than its four calls and \"all calls ok\""
  stop_server numbers_server
}

junit_scenario "greeter: a client's calls answered, SIGTERM stops the server, then the client fails with exit 1" greeter
junit_scenario "object store: arena-sized and pulled objects round trip byte for byte, one past --max-bulk is refused" object_store

junit_scenario "numbers: a stream of each kind and a unary call, then SIGTERM stops the server" numbers
junit_scenario "numbers, the async server (--form async): the same calls, no thread per stream" numbers --form async

junit_finish
