#!/usr/bin/env bash
# Every example binary, given a bad command line, prints what is wrong and its usage to stderr
# and exits 2 (never crashes, never touches a device); --help prints the usage and exits 0.
set -uo pipefail
bin="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE}/examples"
out="${TEST_TMPDIR:-/tmp}/usage_test"
mkdir -p "$out"
failures=0

# expect_usage WANT_EXIT PROGRAM ARGS...: the exit code, and the usage where it belongs.
expect_usage() {
  local want=$1 program=$2
  shift 2
  local rc=0
  timeout 10 "$bin/$program" "$@" >"$out/stdout" 2>"$out/stderr" || rc=$?
  local stream=$out/stderr
  [[ $want == 0 ]] && stream=$out/stdout
  if [[ $rc != "$want" ]] || ! grep -q "^usage: $program " "$stream"; then
    echo "FAILED: $program $* exited $rc (want $want, with the usage on ${stream##*/})"
    sed 's/^/  stdout: /' "$out/stdout"
    sed 's/^/  stderr: /' "$out/stderr"
    failures=$((failures + 1))
  else
    echo "ok: $program $* -> $rc: $(head -n 1 "$stream")"
  fi
}

for program in greeter_server greeter_client object_store_server object_store_client \
    numbers_server numbers_client; do
  expect_usage 0 "$program" --help
  expect_usage 0 "$program" -h
  expect_usage 2 "$program" --bogus 1
  expect_usage 2 "$program" stray
  expect_usage 2 "$program" -
  expect_usage 2 "$program" --
done

for server in greeter_server object_store_server numbers_server; do
  expect_usage 2 "$server" --listen
  expect_usage 2 "$server" --listen nonsense
  expect_usage 2 "$server" --listen 198.18.0.1:65536
  expect_usage 2 "$server" --listen fe80::1:7471
  expect_usage 2 "$server" --listen=198.18.0.1:x
  expect_usage 2 "$server" --listen :1 --listen :2
  expect_usage 2 "$server" --threads 0
  expect_usage 2 "$server" --threads -4
  expect_usage 2 "$server" --threads 99999999999999999999999
done
expect_usage 2 numbers_server --form bogus
expect_usage 2 numbers_server --form
expect_usage 2 object_store_server --arena 100
expect_usage 2 object_store_server --arena 2G
expect_usage 2 object_store_server --arena 0
expect_usage 2 object_store_server --max-bulk 0
expect_usage 2 object_store_server --max-bulk 4G

for client in greeter_client object_store_client numbers_client; do
  expect_usage 2 "$client"
  expect_usage 2 "$client" --connect
  expect_usage 2 "$client" --connect 198.18.0.1
  expect_usage 2 "$client" --connect 198.18.0.1:0
  expect_usage 2 "$client" --connect :7471
  expect_usage 2 "$client" --name x
done
expect_usage 2 greeter_client --connect 198.18.0.1:7471 --calls 0
expect_usage 2 greeter_client --connect 198.18.0.1:7471 --calls many
expect_usage 2 greeter_client --connect 198.18.0.1:7471 --calls=
expect_usage 2 object_store_client --connect 198.18.0.1:7471 --size 2G
expect_usage 2 object_store_client --connect 198.18.0.1:7471 --size 1.5M
expect_usage 2 object_store_client --connect 198.18.0.1:7471 --arena 65
expect_usage 2 object_store_client --connect 198.18.0.1:7471 --name
expect_usage 2 numbers_client --connect 198.18.0.1:7471 --count 0
expect_usage 2 numbers_client --connect 198.18.0.1:7471 --count 1000001

if ((failures)); then
  echo "$failures failed"
  exit 1
fi
echo "all ok"
