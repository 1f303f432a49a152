#!/usr/bin/env bash
# count_calls.sh: what a 64 B echo costs per call in counts that do not move with the emulator's
# noise, for zrpc (busy-polled and event mode, as zrpc_bench runs them; and the default
# configuration: blocking caller, pool handler, event mode) and for perftest's ib_send_lat (busy
# and -e), each counted the same way from outside the program: heap allocations, read and write
# system calls and context switches, per process (server and client), per call.
#
#   count_calls.sh ZRPC_BENCH CALL_COUNTER_SO OUT_DIR [--calls N] [--size BYTES]
#                  [--scaled-spin DURATION]
#
# Run inside tools/softroce (it needs ZRPC_RDMA_DEVICE, _GID_INDEX and _ADDR). Every program runs
# with call_counter.so preloaded (benchmarks/call_counter.cc), which writes its process's totals
# at exit; each system runs twice, N calls and 2N calls, on fresh servers, and the difference
# divided by N is the per-call figure: setup, connection and warm-up cancel out, and work driven
# by time (timers, keepalives, a poller's periodic checks) is counted for as long as N calls
# last. Prints a table with each zrpc figure's target beside it (issue 34: zrpc no more than
# perftest busy-polled, no more than perftest -e plus one per side in event mode, no allocation)
# and writes OUT_DIR/counts.tsv.
set -euo pipefail
zrpc_bench=$1 counter=$2 out=$3
shift 3
calls=2000 size=64 scaled_spin=5ms
while (($#)); do
  case "$1" in
    --calls) calls=${2-} ;;
    --size) size=${2-} ;;
    --scaled-spin) scaled_spin=${2-} ;;
    *) echo "count_calls.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  (($# >= 2)) || { echo "count_calls.sh: $1 needs a value" >&2; exit 2; }
  shift 2
done
for n in "$calls" "$size"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "count_calls.sh: \"$n\" is not a positive number" >&2; exit 2; }
done
: "${ZRPC_RDMA_DEVICE:?run through tools/softroce}" "${ZRPC_RDMA_GID_INDEX:?}" "${ZRPC_RDMA_ADDR:?}"
[[ -f "$counter" ]] || { echo "count_calls.sh: no counter library at $counter" >&2; exit 2; }
counter=$(readlink -f "$counter")
mkdir -p "$out"
logs=$out/count-logs
mkdir -p "$logs"
source "$(dirname "$(readlink -f "$0")")/bench_lib.sh"

# counted FILE PROGRAM ARGS...: PROGRAM with the counter, its totals to FILE. A command (env
# execs the program, which keeps the PID), not a function: a backgrounded function would be a
# subshell, and stop_server's SIGTERM would end the subshell instead of the server.
counted() { echo env ZRPC_COUNT_OUT="$1" LD_PRELOAD="$counter"; }

# zrpc NAME N SERVER_FLAGS CLIENT_FLAGS: zrpc_bench's server and one echo client of N calls at 1
# in flight (each FLAGS one word list, split on spaces).
zrpc() {
  local name=$1 n=$2 server_flags=$3 client_flags=$4
  rm -f "$logs/$name.$n.server" "$logs/$name.$n.client"
  # shellcheck disable=SC2046,SC2086 # counted's words and the flags hold no spaces
  start_server "zrpc_$name" $(counted "$logs/$name.$n.server") "$zrpc_bench" server \
    --listen "$ZRPC_RDMA_ADDR:0" $server_flags
  # shellcheck disable=SC2046,SC2086
  $(counted "$logs/$name.$n.client") "$zrpc_bench" client --connect "$target" --workload echo \
    --size "$size" --in-flight 1 --calls "$n" --warmup 200 $client_flags >"$logs/zrpc_$name.$n.log"
  stop_server "zrpc_$name"
}

# perftest NAME N FLAGS...: ib_send_lat's two sides, N iterations (one round trip each). A run
# that hangs (`ib_send_lat -e` has, in a freshly booted guest) is bounded and run again.
perftest() {
  local name=$1 n=$2
  shift 2
  local common=(-d "$ZRPC_RDMA_DEVICE" -x "$ZRPC_RDMA_GID_INDEX" -p 18516 -F -s "$size" -n "$n" "$@")
  local attempt i
  for ((attempt = 0; attempt < 3; attempt++)); do
    rm -f "$logs/$name.$n.server" "$logs/$name.$n.client"
    timeout -k 5 60 $(counted "$logs/$name.$n.server") ib_send_lat "${common[@]}" >"$logs/$name.$n.server.log" 2>&1 &
    local pid=$!
    for ((i = 0; i < 50; i++)); do
      if timeout -k 5 60 $(counted "$logs/$name.$n.client") ib_send_lat "${common[@]}" "$ZRPC_RDMA_ADDR" >"$logs/$name.$n.client.log" 2>&1; then
        break
      fi
      grep -q "Couldn't connect" "$logs/$name.$n.client.log" || break
      rm -f "$logs/$name.$n.client"
      sleep 0.2
    done
    if wait "$pid" && [[ -s "$logs/$name.$n.server" && -s "$logs/$name.$n.client" ]]; then
      return 0
    fi
    echo "(ib_send_lat $* -n $n failed or hung; running it again)"
  done
  echo "count_calls.sh: ib_send_lat $* -n $n failed 3 times" >&2
  cat "$logs/$name.$n.client.log" >&2
  return 1
}

# per_call NAME SIDE: "allocs reads writes csw" per call, from the N and 2N runs' totals.
per_call() {
  local name=$1 side=$2
  awk -v n="$calls" '
    function field(line, key,   i, parts, kv) {
      split(line, parts, " ")
      for (i in parts) { split(parts[i], kv, "="); if (kv[1] == key) return kv[2] + 0 }
      return -1
    }
    FNR == 1 { line[++files] = $0 }
    END {
      split("allocs reads writes", keys, " ")
      for (k = 1; k <= 3; k++) {
        printf "%.2f ", (field(line[2], keys[k]) - field(line[1], keys[k])) / n
      }
      csw1 = field(line[1], "vcsw") + field(line[1], "ivcsw")
      csw2 = field(line[2], "vcsw") + field(line[2], "ivcsw")
      printf "%.2f\n", (csw2 - csw1) / n
    }' "$logs/$name.$calls.$side" "$logs/$name.$((2 * calls)).$side"
}

for n in "$calls" $((2 * calls)); do
  zrpc busy "$n" "" ""
  zrpc event "$n" --event --event
  # The default configuration users get: blocking caller, handler on the pool, event mode.
  zrpc default "$n" "--event --pool-handlers" "--event --blocking"
  # The same two with the spin's cap scaled to the emulator (a round trip here is 100-700 us,
  # past the 50 us default): what adaptive polling saves when the cap covers the round trip.
  zrpc event_spin "$n" "--event --spin $scaled_spin" "--event --spin $scaled_spin"
  zrpc default_spin "$n" "--event --pool-handlers --spin $scaled_spin" \
    "--event --blocking --spin $scaled_spin"
  perftest perftest "$n"
  perftest perftest_e "$n" -e
done

tsv=$out/counts.tsv
printf 'system\tside\tallocs\treads\twrites\tcsw\n' >"$tsv"
for name in busy event default event_spin default_spin perftest perftest_e; do
  for side in server client; do
    read -r a r w c <<<"$(per_call "$name" "$side")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$side" "$a" "$r" "$w" "$c" >>"$tsv"
  done
done

# The table: each zrpc row beside its target, taken from perftest's row in this same run.
awk -F'\t' -v calls="$calls" -v size="$size" -v spin="$scaled_spin" '
  NR == 1 { next }
  { key = $1 "/" $2; a[key] = $3; r[key] = $4; w[key] = $5; c[key] = $6 }
  # Context switches are printed, not judged: the scheduler decides them, and their differences
  # between runs move by tenths (some come out negative). 0.02 a call is a keepalive or a timer
  # now and then, not a per-call cost.
  function row(label, key, base, extra,   verdict, t) {
    t = "allocs 0, reads/writes <= " (extra ? "perftest -e + 1" : "perftest")
    verdict = (a[key] <= 0.02 && r[key] <= r[base] + extra + 0.02 &&
               w[key] <= w[base] + extra + 0.02) ? "met" : "MISSED"
    printf "  %-28s %8.2f %8.2f %8.2f %8.2f   %s: %s\n", label, a[key], r[key], w[key], c[key], t, verdict
  }
  function plain(label, key) {
    printf "  %-28s %8.2f %8.2f %8.2f %8.2f\n", label, a[key], r[key], w[key], c[key]
  }
  END {
    printf "Per call, counted from outside each process (%d B echo, 1 in flight; runs of %d and %d calls differenced):\n", size, calls, 2 * calls
    printf "  %-28s %8s %8s %8s %8s\n", "", "allocs", "reads", "writes", "ctx sw"
    plain("perftest busy, server", "perftest/server")
    plain("perftest busy, client", "perftest/client")
    row("zrpc busy, server", "busy/server", "perftest/server", 0)
    row("zrpc busy, client", "busy/client", "perftest/client", 0)
    plain("perftest -e, server", "perftest_e/server")
    plain("perftest -e, client", "perftest_e/client")
    row("zrpc event, server", "event/server", "perftest_e/server", 1)
    row("zrpc event, client", "event/client", "perftest_e/client", 1)
    plain("zrpc default, server", "default/server")
    plain("zrpc default, client", "default/client")
    printf "  (default: blocking caller, handler on the pool, event mode; recorded, no target yet)\n"
    plain("zrpc event, spin " spin ", server", "event_spin/server")
    plain("zrpc event, spin " spin ", client", "event_spin/client")
    plain("zrpc default, spin " spin ", server", "default_spin/server")
    plain("zrpc default, spin " spin ", client", "default_spin/client")
    printf "  (spin %s: the cap scaled to the emulator, whose round trip is past the default 50 us)\n", spin
  }' "$tsv"
