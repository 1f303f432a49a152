#!/usr/bin/env bash
# Counts what one round trip costs, exactly: count_instructions (a 64 B echo over fakeverbs, no
# poller threads, this process driving both sides) under callgrind, the transport alone and
# through the RPC runtime, two phases of --calls round trips each. Prints per round trip the
# instructions zrpc executed, heap allocations, mutex acquisitions, clock reads and syscall()
# calls, atomic read-modify-write instructions (all, and those in zrpc's own code) and entries
# into a connection's serialization domain, then the
# RPC layer's instructions over the transport's against the target, and writes counts.tsv to
# OUT_DIR.
#
# What the stand-in device does is not zrpc's: callgrind stops collecting inside fakeverbs' data
# path (its entry namespace, and the cm and completion-channel reads a poller pass makes) and
# everything they call (--collect-atstart=yes after the toggles: each --toggle-collect turns the
# start state off). A real device's provider would cost instructions there too (rxe's
# post_send is a system call); they belong to the device, not to zrpc's layers.
#
# Usage: count_instructions.sh COUNT_INSTRUCTIONS OUT_DIR [--calls N] [--warmup N] [--depth D]
#                                [--shared-receive-queue R] [--idle N] [--background-locks N]
#
# --depth D keeps D round trips in flight (count_instructions' chains), so that a poller pass
# handles batches; the doorbells (ibv_post_send and ibv_post_recv calls) per round trip show what
# a batch shares. They are printed after the table, and written to OUT_DIR/doorbells.tsv.
# --shared-receive-queue R counts both sides with a shared receive queue of R receives per poller.
# --idle N opens N idle connections to the RPC server beside the counted one (the transport's
# count has none): what idle connections add to a call's work shows against a run without.
# --background-locks N runs a thread taking a mutex N times a millisecond beside both modes (below).
#
# Each thread is recorded apart, and a phase's dump is the driving thread's alone (callgrind's
# dump request writes the calling thread's costs): the runtime's threads that run by the clock
# (a channel's timer and restorer, the server's sweeper, the listener) stay out of the count
# wherever their passes fall. With 1,000 idle connections, a pass of another thread that fell in
# one phase and not the other (a lock each for a thousand things: most likely the idle
# channel's restorer) once moved it by 3.3 locks and 360 instructions a call. A call that handed work to another thread would have to wake it: the
# `wakes` column counts that.
#
# The two phases are the same work: they must agree (to 0.5 %) or the count is not exact and
# the script fails. Each run is given COUNT_TIMEOUT seconds (default 150); one that takes longer
# fails with the steps it finished (count_instructions prints each, with its time, to stderr).
# Needs valgrind (tools/install-deps installs it).
set -euo pipefail
bin=$1 out=$2
shift 2
calls=500 warmup=500 depth=1 srq=() idle=() background=()
while (($#)); do
  case "$1" in
    --calls) calls=${2-} ;;
    --warmup) warmup=${2-} ;;
    --depth) depth=${2-} ;;
    --shared-receive-queue) srq=(--shared-receive-queue "${2-}") ;;
    --idle) idle=(--idle "${2-}") ;;
    --background-locks) background=(--background-locks "${2-}") ;;
    *) echo "count_instructions.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  (($# >= 2)) || { echo "count_instructions.sh: $1 needs a value" >&2; exit 2; }
  shift 2
done
for n in "$calls" "$warmup" "$depth"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "count_instructions.sh: \"$n\" is not a count" >&2; exit 2; }
done
command -v valgrind >/dev/null || { echo "count_instructions.sh: valgrind is not installed" >&2; exit 1; }
here=$(dirname "$(readlink -f "$0")")
mkdir -p "$out"
rm -f "$out"/callgrind.* "$out/counts.tsv" "$out/doorbells.tsv"
printf 'mode\tsend doorbells\treceive doorbells\n' >"$out/doorbells.tsv"
for mode in transport rpc; do
  extra=()
  [[ $mode == rpc ]] && extra=("${idle[@]}")
  # LD_BIND_NOW: every symbol resolved at start, not at its first call, which may fall in either
  # phase (a thousand instructions or so each: phase 1 once counted 17 a call more for it).
  LD_BIND_NOW=1 timeout "${COUNT_TIMEOUT:-150}" valgrind --tool=callgrind --separate-threads=yes \
    --dump-instr=yes --compress-strings=no --compress-pos=no \
    --toggle-collect='zrpc::fakeverbs::entry::*' --toggle-collect=rdma_get_cm_event \
    --toggle-collect=rdma_ack_cm_event --toggle-collect=ibv_get_cq_event \
    --toggle-collect=ibv_ack_cq_events --collect-atstart=yes \
    --callgrind-out-file="$out/callgrind.$mode" "$bin" "$mode" --calls "$calls" \
    --warmup "$warmup" --depth "$depth" "${srq[@]}" "${background[@]}" "${extra[@]}" \
    >"$out/$mode.log" 2>&1 || {
    status=$?
    if ((status == 124)); then
      echo "count_instructions.sh: count_instructions $mode took more than ${COUNT_TIMEOUT:-150} s; its last steps:" >&2
      grep -h '^count_instructions: step' "$out/$mode.log" | tail -n 5 >&2
    else
      echo "count_instructions.sh: count_instructions $mode failed:" >&2
    fi
    tail -n 20 "$out/$mode.log" >&2
    exit 1
  }
  # Dump 1 is setup and warm-up; 2 and 3 the phases; -01 the driving (first) thread's.
  dumps=("$out/callgrind.$mode.2-01" "$out/callgrind.$mode.3-01")
  for d in "${dumps[@]}"; do
    [[ -s "$d" ]] || { echo "count_instructions.sh: no dump $d" >&2; exit 1; }
  done
  # The device carried the calls: two sends and two completions or more per round trip.
  awk -v c="$calls" -v m="$mode" '/^phase / { n++; if ($5 < 2 * c || $7 < 2 * c) bad = 1 }
    END { if (n != 2 || bad) { printf "count_instructions.sh: %s: fakeverbs did not carry the calls\n", m; exit 1 } }' \
    "$out/$mode.log" >&2
  # Doorbells per round trip, over both phases.
  awk -v c="$calls" -v m="$mode" '/^phase / { s += $9; r += $12 }
    END { printf "%s\t%.3f\t%.3f\n", m, s / (2 * c), r / (2 * c) }' "$out/$mode.log" >>"$out/doorbells.tsv"
  python3 "$here/callgrind_counts.py" "$calls" "${dumps[@]}" |
    awk -v m="$mode" 'NR == 1 { print "mode\t" $0; next } { print m "\t" $0 }' >>"$out/counts.tsv.raw"
done
# One header; the rows of both modes.
awk 'NR == 1 || $1 != "mode"' "$out/counts.tsv.raw" >"$out/counts.tsv"
rm -f "$out/counts.tsv.raw"
awk -F'\t' '
  NR == 1 { next }
  { ir[$1, $2] = $3; row[$1, $2] = $0 }
  END {
    printf "%-10s %6s %12s %8s %8s %8s %9s %8s %13s %8s %8s\n", "per call", "phase", "instructions",
      "allocs", "locks", "clocks", "syscalls", "atomics", "atomics(zrpc)", "entries", "wakes"
    n = split("transport rpc", modes, " ")
    bad = 0
    for (i = 1; i <= n; i++) {
      m = modes[i]
      for (p = 1; p <= 2; p++) {
        split(row[m, p], f, "\t")
        printf "%-10s %6d %12.1f %8.3f %8.3f %8.3f %9.3f %8.3f %13.3f %8.3f %8.3f\n", m, p, f[3],
          f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]
      }
      d = ir[m, 1] - ir[m, 2]; if (d < 0) d = -d
      if (d > 0.005 * ir[m, 1]) {
        printf "%s: the two phases differ by %.1f instructions per call: the count is not exact\n",
          m, d
        bad = 1
      }
    }
    ratio = ir["rpc", 1] / ir["transport", 1]
    printf "rpc / transport instructions per round trip: %.2f (target <= 1.10: %s)\n", ratio,
      ratio <= 1.10 ? "met" : "MISSED"
    exit bad
  }' "$out/counts.tsv"
awk -F'\t' -v d="$depth" 'NR > 1 {
    printf "%s doorbells per round trip at depth %d: %.3f send, %.3f receive\n", $1, d, $2, $3
  }' "$out/doorbells.tsv"
