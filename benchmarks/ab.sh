#!/usr/bin/env bash
# Before and after, in one guest: two builds of zrpc_bench and transport_bench (directories A and
# B holding both programs) run in alternating rounds -- A then B in odd rounds, B then A in even
# ones, so drift in the guest falls on both -- each round measuring zrpc's echo with 1 and with
# --in-flight calls in flight (busy-polling), zrpc's echo in event mode on both sides, and the
# transport's echo with 1 and --in-flight. bench_report then prints each build's medians and layer
# ratios, and the last block compares the builds row by row: B's figure over A's within each
# round, its median and min-max over the rounds. A change is real only when that spread
# excludes 1 (the guest moves +-30 % between rounds; CALL_PATH.md).
#
# Usage (inside tools/softroce run): ab.sh A_DIR B_DIR BENCH_REPORT OUT_DIR [--rounds N]
#                                          [--calls N] [--in-flight N] [--size B]
set -euo pipefail
a_dir=$1 b_dir=$2 bench_report=$3 out=$4
shift 4
rounds=5 calls=5000 in_flight=32 size=64
while (($#)); do
  case "$1" in
    --rounds) rounds=${2-} ;;
    --calls) calls=${2-} ;;
    --in-flight) in_flight=${2-} ;;
    --size) size=${2-} ;;
    *) echo "ab.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  (($# >= 2)) || { echo "ab.sh: $1 needs a value" >&2; exit 2; }
  shift 2
done
for n in "$rounds" "$calls" "$in_flight" "$size"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "ab.sh: \"$n\" is not a number" >&2; exit 2; }
done
: "${ZRPC_RDMA_DEVICE:?run through tools/softroce}" "${ZRPC_RDMA_ADDR:?}"
mkdir -p "$out"
logs=$out/logs
mkdir -p "$logs"
source "$(dirname "$0")/bench_lib.sh"
: >"$out/A.jsonl"
: >"$out/B.jsonl"

# measure NAME DIR: one round of every row for the build in DIR, into $out/NAME.jsonl.
measure() {
  local name=$1 dir=$2 results=$out/$1.jsonl
  local client=(client --round "$round" --json "$results" --size "$size" --calls "$calls" --warmup 500)
  start_server "zrpc_$name" "$dir/zrpc_bench" server --listen "$ZRPC_RDMA_ADDR:0"
  "$dir/zrpc_bench" "${client[@]}" --connect "$target" --workload echo --in-flight 1
  "$dir/zrpc_bench" "${client[@]}" --connect "$target" --workload echo --in-flight "$in_flight"
  stop_server "zrpc_$name"
  start_server "zrpc_event_$name" "$dir/zrpc_bench" server --listen "$ZRPC_RDMA_ADDR:0" --event
  # As "echo_event" whichever build: zrpc_bench labels its event rows so only since issue 20.
  local event=$out/$name.event.jsonl
  "$dir/zrpc_bench" client --round "$round" --json "$event" --size "$size" --calls "$calls" \
    --warmup 500 --connect "$target" --workload echo --in-flight 1 --event
  sed 's/"workload":"echo"/"workload":"echo_event"/' "$event" >>"$results"
  rm -f "$event"
  stop_server "zrpc_event_$name"
  start_server "transport_$name" "$dir/transport_bench" server --listen "$ZRPC_RDMA_ADDR:0"
  "$dir/transport_bench" "${client[@]}" --connect "$target" --in-flight 1
  "$dir/transport_bench" "${client[@]}" --connect "$target" --in-flight "$in_flight"
  stop_server "transport_$name"
}

for ((round = 1; round <= rounds; round++)); do
  echo "== round $round of $rounds"
  if ((round % 2)); then
    measure A "$a_dir"
    measure B "$b_dir"
  else
    measure B "$b_dir"
    measure A "$a_dir"
  fi
done
for name in A B; do
  echo "== build $name ($([[ $name == A ]] && echo "$a_dir" || echo "$b_dir")): medians of $rounds rounds"
  "$bench_report" --json "$out/$name.json" "$out/$name.jsonl"
done
echo "== B / A, row by row: the median over rounds of B's figure over A's in the same round (min-max)"
python3 - "$out/A.jsonl" "$out/B.jsonl" <<'PY'
import json, statistics, sys
def rows(path):
    out = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            out[(r["system"], r["workload"], r["in_flight"], r["round"])] = r
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
configs = sorted({k[:3] for k in a} & {k[:3] for k in b})
for system, workload, in_flight in configs:
    for field, label in (("p50_us", "p50"), ("calls_per_sec", "calls/s")):
        ratios = []
        for (s, w, f, rnd), ra in a.items():
            rb = b.get((s, w, f, rnd))
            if (s, w, f) != (system, workload, in_flight) or rb is None:
                continue
            if ra.get(field) and rb.get(field):
                ratios.append(rb[field] / ra[field])
        if ratios:
            print(f"{system:9} {workload:11} in_flight {in_flight:3} {label:8} B/A "
                  f"{statistics.median(ratios):6.3f} ({min(ratios):.3f}-{max(ratios):.3f}, "
                  f"{len(ratios)} rd)")
PY
