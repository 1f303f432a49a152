#!/usr/bin/env bash
# zrpc's RPCs next to perftest and gRPC on one device, in alternating rounds (tools/bench runs it
# inside tools/softroce). Each round runs, in turn: perftest ib_send_lat (busy-polling, and with
# -e: sleeping on completion events), ib_send_bw (one way, and -b: both ways, the yardstick of an
# echo's rate) and ib_write_bw; zrpc_bench echo with one call in flight (round trip; also with
# both sides in event mode as "echo_event" next to perftest's "send_lat_event", and in zrpc's
# default configuration, a blocking caller and pool handlers in event mode, as
# "echo_blocking_event"), echo with many in flight
# (call rate) and bulk put (goodput), from ordinary memory (staged) and from registered memory
# (zero-copy), at --bulk-size, or with --bulk-sweep at 4 KiB to 64 MiB each next to ib_write_bw
# at the same size and depth (the depth shrinks with the size: at most 64 MiB in flight); transport_bench echo, one and many in flight, and one in
# flight in event mode (zrpc's transport alone: the layer between perftest and zrpc's RPCs); grpc_bench echo (gRPC C++ over TCP on the same guest) with
# one and many in flight; all at the same sizes. Beside those, one zrpc stream of --stream-size
# messages (4 KiB by default: zrpc_bench --workload stream, --in-flight its window) next to
# ib_send_bw at that size and depth. Every run appends one JSON line to results.jsonl;
# bench_report then takes the medians across rounds, prints the table and the ratios against
# the targets, and writes the JSON summary and the latency CDF picture. With --counts
# CALL_COUNTER_SO it then counts, per call and from outside each process, the allocations, read
# and write system calls and context switches of zrpc's echo and perftest's (count_calls.sh).
#
# With --sweep it walks zrpc alone instead (zrpc_bench --sweep: echo at 0 B to 4 KiB, put and get
# at 4 KiB to 16 MiB, each at 1 to 64 calls in flight over 1 and 2 connections, one second
# each) and prints how latency and throughput grow with the work: sweep.jsonl, sweep.json.
#
# Usage: compare.sh ZRPC_BENCH TRANSPORT_BENCH GRPC_BENCH BENCH_REPORT OUT_DIR [--rounds N]
#                   [--size B] [--bulk-size B] [--stream-size B] [--calls N] [--in-flight N]
#                   [--sweep] [--bulk-sweep] [--counts CALL_COUNTER_SO]
set -euo pipefail
zrpc_bench=$1 transport_bench=$2 grpc_bench=$3 bench_report=$4 out=$5
shift 5
rounds=5 size=64 bulk_size=$((1 << 20)) stream_size=4096 calls=5000 in_flight=32 sweep=0
bulk_sweep=0 counter=""
while (($#)); do
  case "$1" in
    --counts) counter=${2-} ;;
    --sweep) sweep=1; shift; continue ;;
    --bulk-sweep) bulk_sweep=1; shift; continue ;;
    --rounds) rounds=${2-} ;;
    --size) size=${2-} ;;
    --bulk-size) bulk_size=${2-} ;;
    --stream-size) stream_size=${2-} ;;
    --calls) calls=${2-} ;;
    --in-flight) in_flight=${2-} ;;
    *) echo "compare.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  (($# >= 2)) || { echo "compare.sh: $1 needs a value" >&2; exit 2; }
  shift 2
done
for n in "$rounds" "$size" "$bulk_size" "$stream_size" "$calls" "$in_flight"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "compare.sh: \"$n\" is not a number" >&2; exit 2; }
done
: "${ZRPC_RDMA_DEVICE:?run through tools/softroce}" "${ZRPC_RDMA_GID_INDEX:?}" "${ZRPC_RDMA_ADDR:?}"
mkdir -p "$out"
results=$out/results.jsonl
((sweep)) || : >"$results"
: >"$out/missing.txt"
logs=$out/logs
mkdir -p "$logs"
bulk_calls=$((calls / 50 > 50 ? calls / 50 : 50))
if ((bulk_sweep)); then
  bulk_sizes=(4096 65536 1048576 16777216 67108864)
else
  bulk_sizes=("$bulk_size")
fi
max_bulk=${bulk_sizes[-1]}
# Calls in flight for a bulk size: --in-flight, but at most 64 MiB of payloads at once (the
# staging a client keeps by default, and what an emulated guest's memory takes), at least one.
bulk_depth() {
  local depth=$(((64 << 20) / $1))
  ((depth > in_flight)) && depth=$in_flight
  ((depth < 1)) && depth=1
  echo "$depth"
}

# perftest's latency distribution (-H): every iteration's one-way latency, sorted, one
# "N, VALUE" line each under a "#, usec" header. Prints "P90 CDF" for perftest_json: the
# nearest-rank p90 and up to 200 points at evenly spaced quantiles, picked as bench_report's
# Summarize picks them (report.cc), or "null []" when the log has none.
perftest_distribution() {
  awk '/^#, / { h = 1; next } h && /^ *[0-9]+, *[0-9.eE+-]+ *$/ { split($0, f, ","); print f[2] + 0 }' "$1" |
    sort -g |
    awk '{ v[n++] = $1 }
      END {
        if (n == 0) { print "null []"; exit }
        r = int((900 * n + 999) / 1000); if (r < 1) r = 1; if (r > n) r = n
        m = n < 200 ? n : 200
        out = "["
        if (m == 1) out = out v[0]
        else for (i = 0; i < m; i++) {
          out = out (i ? "," : "") v[int((2 * i * (n - 1) + (m - 1)) / (2 * (m - 1)))]
        }
        print v[r - 1], out "]"
      }'
}

# One JSON line for a perftest run. Latency: one-way, as perftest reports it (report.h). For
# send_lat, $4 is perftest_distribution's output.
perftest_json() {
  local workload=$1 in_flight=$2 line=$3 distribution=${4:-null []}
  # No line (perftest_run gave up on the row): no row. awk would make one of an empty record.
  [[ -n "$line" ]] || return 0
  case "$workload" in
    send_lat*)  # bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
      awk -v r="$round" -v f="$in_flight" -v w="$workload" -v d="$distribution" 'BEGIN { split(d, dist, " ") } { printf "{\"system\":\"perftest\",\"workload\":\"%s\",\"size\":%d,\"in_flight\":%d,\"threads\":1,\"connections\":1,\"round\":%d,\"calls\":%d,\"seconds\":0,\"p50_us\":%s,\"p90_us\":%s,\"p99_us\":%s,\"p999_us\":%s,\"max_us\":%s,\"calls_per_sec\":0,\"goodput_mib_per_sec\":0,\"client_cpu_us_per_call\":-1,\"server_cpu_us_per_call\":-1,\"cdf_us\":%s,\"note\":\"one-way latency (t_typical as p50)\"}\n", w, $1, f, r, $2, $5, dist[1], $8, $9, $4, dist[2] }' <<<"$line" ;;
    *)  # bytes iters bw_peak bw_avg[MiB/s] msg_rate[Mpps]
      awk -v r="$round" -v f="$in_flight" -v w="$workload" '{ printf "{\"system\":\"perftest\",\"workload\":\"%s\",\"size\":%d,\"in_flight\":%d,\"threads\":1,\"connections\":1,\"round\":%d,\"calls\":%d,\"seconds\":0,\"p50_us\":null,\"p90_us\":null,\"p99_us\":null,\"p999_us\":null,\"max_us\":null,\"calls_per_sec\":%.0f,\"goodput_mib_per_sec\":%s,\"client_cpu_us_per_call\":-1,\"server_cpu_us_per_call\":-1,\"cdf_us\":[],\"note\":\"\"}\n", w, $1, f, r, $2, $5 * 1e6, $4 }' <<<"$line" ;;
  esac
}

# Servers: up only while their client runs (bench_lib.sh says why).
source "$(dirname "$0")/bench_lib.sh"

if ((sweep)); then
  : >"$out/sweep.jsonl"
  start_server zrpc_server "$zrpc_bench" server --listen "$ZRPC_RDMA_ADDR:0" --max-bulk $((16 << 20))
  for workload in echo put get; do
    echo "== zrpc $workload sweep"
    "$zrpc_bench" client --connect "$target" --workload "$workload" --sweep --duration 1 \
      --warmup "$([[ $workload == echo ]] && echo 200 || echo 4)" --json "$out/sweep.jsonl"
  done
  stop_server zrpc_server
  echo "== sweep (device $ZRPC_RDMA_DEVICE, ${ZRPC_SOFTROCE_MODE:-direct})"
  "$bench_report" --json "$out/sweep.json" "$out/sweep.jsonl"
  echo "results: $out/sweep.jsonl, summary: $out/sweep.json"
  exit 0
fi

for ((round = 1; round <= rounds; round++)); do
  echo "== round $round of $rounds"
  perftest_run ib_send_lat send_lat -s "$size" -n "$calls" -H
  perftest_json send_lat 1 "$(data_line "$logs/send_lat.client")" \
    "$(perftest_distribution "$logs/send_lat.client")" >>"$results"
  perftest_run ib_send_lat send_lat_event -s "$size" -n "$calls" -e -H
  perftest_json send_lat_event 1 "$(data_line "$logs/send_lat_event.client")" \
    "$(perftest_distribution "$logs/send_lat_event.client")" >>"$results"
  perftest_run ib_send_bw send_bw -s "$size" -n "$calls" -t "$in_flight"
  perftest_json send_bw "$in_flight" "$(data_line "$logs/send_bw.client")" >>"$results"
  # Both ways at once (-b: messages of both directions summed): what an echo's rate compares with.
  perftest_run ib_send_bw send_bw_bidir -s "$size" -n "$calls" -t "$in_flight" -b
  perftest_json send_bw_bidir "$in_flight" "$(data_line "$logs/send_bw_bidir.client")" >>"$results"
  perftest_run ib_send_bw send_bw_stream -s "$stream_size" -n "$calls" -t "$in_flight"
  perftest_json send_bw "$in_flight" "$(data_line "$logs/send_bw_stream.client")" >>"$results"
  for bulk in "${bulk_sizes[@]}"; do
    perftest_run ib_write_bw write_bw -s "$bulk" -n "$bulk_calls" -t "$(bulk_depth "$bulk")"
    perftest_json write_bw "$(bulk_depth "$bulk")" "$(data_line "$logs/write_bw.client")" >>"$results"
  done
  start_server zrpc_server "$zrpc_bench" server --listen "$ZRPC_RDMA_ADDR:0" --max-bulk "$max_bulk"
  common=(client --connect "$target" --round "$round" --json "$results")
  "$zrpc_bench" "${common[@]}" --workload echo --size "$size" --in-flight 1 --calls "$calls" --warmup 500
  "$zrpc_bench" "${common[@]}" --workload echo --size "$size" --in-flight "$in_flight" --calls "$calls" --warmup 500
  "$zrpc_bench" "${common[@]}" --workload stream --size "$stream_size" --in-flight "$in_flight" \
    --calls "$calls" --warmup 500
  for bulk in "${bulk_sizes[@]}"; do
    for registered in "" --registered; do
      "$zrpc_bench" "${common[@]}" --workload put --size "$bulk" --in-flight "$(bulk_depth "$bulk")" \
        --calls "$bulk_calls" --warmup 10 $registered
    done
  done
  stop_server zrpc_server
  # Event mode on both sides (the default users get), next to perftest's -e.
  start_server zrpc_server "$zrpc_bench" server --listen "$ZRPC_RDMA_ADDR:0" --event
  "$zrpc_bench" client --connect "$target" --round "$round" --json "$results" --event \
    --workload echo --size "$size" --in-flight 1 --calls "$calls" --warmup 500
  stop_server zrpc_server
  # zrpc's defaults, as a user's program gets them: handlers on the server's pool, a blocking
  # caller, event mode on both sides ("echo_blocking_event").
  start_server zrpc_server "$zrpc_bench" server --listen "$ZRPC_RDMA_ADDR:0" --event --pool-handlers
  "$zrpc_bench" client --connect "$target" --round "$round" --json "$results" --event --blocking \
    --workload echo --size "$size" --in-flight 1 --calls "$calls" --warmup 500
  stop_server zrpc_server
  start_server transport_server "$transport_bench" server --listen "$ZRPC_RDMA_ADDR:0"
  common=(client --connect "$target" --round "$round" --json "$results")
  "$transport_bench" "${common[@]}" --size "$size" --in-flight 1 --calls "$calls" --warmup 500
  "$transport_bench" "${common[@]}" --size "$size" --in-flight "$in_flight" --calls "$calls" --warmup 500
  stop_server transport_server
  start_server transport_server "$transport_bench" server --listen "$ZRPC_RDMA_ADDR:0" --event
  "$transport_bench" client --connect "$target" --round "$round" --json "$results" --event \
    --size "$size" --in-flight 1 --calls "$calls" --warmup 500
  stop_server transport_server
  start_server grpc_server "$grpc_bench" server --listen "$ZRPC_RDMA_ADDR:0"
  common=(client --connect "$target" --round "$round" --json "$results")
  "$grpc_bench" "${common[@]}" --size "$size" --in-flight 1 --calls "$calls" --warmup 500
  "$grpc_bench" "${common[@]}" --size "$size" --in-flight "$in_flight" --calls "$calls" --warmup 500
  stop_server grpc_server
done
echo "== medians of $rounds rounds (device $ZRPC_RDMA_DEVICE, ${ZRPC_SOFTROCE_MODE:-direct})"
"$bench_report" --json "$out/summary.json" --svg "$out/latency_cdf.svg" --svg-workload echo \
  --svg-size "$size" "$results"
echo "results: $results, summary: $out/summary.json, latency CDF: $out/latency_cdf.svg"
if [[ -s "$out/missing.txt" ]]; then
  echo "== rows missing from some rounds (their medians are over fewer rounds):"
  cat "$out/missing.txt"
fi
# With --counts CALL_COUNTER_SO (tools/bench gives it): the per-call counts that do not move with
# the noise, zrpc next to perftest (count_calls.sh).
if [[ -n "$counter" ]]; then
  echo "== per-call counts (benchmarks/count_calls.sh)"
  "$(dirname "$(readlink -f "$0")")/count_calls.sh" "$zrpc_bench" "$counter" "$out" --size "$size"
fi
