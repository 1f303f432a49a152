#!/usr/bin/env bash
# Raw-verbs baseline, run where a device exists (tools/bench runs it inside tools/softroce):
# zrpc's RcEndpoint ping-pong and WRITE stream, then perftest's ib_send_lat and ib_write_bw with
# the same message sizes on the same device, then the ratios. Only ratios carry over between
# machines; Soft-RoCE under emulation is orders of magnitude slower than hardware, and noisy
# (+-30% from one run to the next), so the two programs alternate for --rounds rounds and the
# summary gives the median of each and of the per-round ratios.
#
# Usage: verbs_baseline.sh PATH/TO/verbs_pingpong [--size B] [--iters N] [--write-size B]
#                          [--write-total B] [--window N] [--rounds N]
set -euo pipefail
pingpong=$1
shift
size=64 iters=10000 write_size=65536 write_total=$((32 << 20)) window=16 rounds=3
while (($#)); do
  case "$1" in
    --size) size=$2 ;;
    --iters) iters=$2 ;;
    --write-size) write_size=$2 ;;
    --write-total) write_total=$2 ;;
    --window) window=$2 ;;
    --rounds) rounds=$2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
: "${ZRPC_RDMA_DEVICE:?run through tools/softroce}" "${ZRPC_RDMA_GID_INDEX:?}" "${ZRPC_RDMA_ADDR:?}"
out=$(mktemp -d "${TMPDIR:-/tmp}/zrpc-bench.XXXXXX")
trap 'rm -rf "$out"' EXIT

# perftest: a server in the background, then the client; both on this device and GID. Under
# emulation perftest's cycle-counter calibration sometimes fails and it prints "inf" for every
# latency; such a run is repeated (up to 3 times) rather than averaged in.
perftest() {
  local tool=$1 name=$2
  shift 2
  local common=(-d "$ZRPC_RDMA_DEVICE" -x "$ZRPC_RDMA_GID_INDEX" -p 18515 -F "$@")
  local attempt
  for ((attempt = 0; attempt < 3; attempt++)); do
    perftest_once "$tool" "$name" || return 1
    data_line "$out/$name.client" | grep -qv -e inf -e nan && return 0
    echo "(perftest printed non-finite figures; running it again)"
  done
}
perftest_once() {
  local tool=$1 name=$2
  "$tool" "${common[@]}" >"$out/$name.server" 2>&1 &
  local server=$!
  local i
  for ((i = 0; i < 50; i++)); do
    if "$tool" "${common[@]}" "$ZRPC_RDMA_ADDR" >"$out/$name.client" 2>&1; then
      wait "$server"
      return 0
    fi
    grep -q "Couldn't connect" "$out/$name.client" || break
    sleep 0.2  # the server is not listening yet
  done
  kill "$server" 2>/dev/null || true
  cat "$out/$name.client" >&2
  return 1
}
# perftest's figures: the first numeric line after the header line that starts with "#bytes".
data_line() { awk '/^ *#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { print; exit }' "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

writes=$((write_total / write_size))
for ((round = 1; round <= rounds; round++)); do
  echo "== round $round of $rounds: zrpc raw verbs (transport::RcEndpoint)"
  "$pingpong" --size "$size" --iters "$iters" --write-size "$write_size" \
    --write-total "$write_total" --window "$window" | tee "$out/zrpc.txt"
  echo "== round $round of $rounds: perftest ib_send_lat -s $size -n $iters; ib_write_bw -s $write_size -n $writes -t $window"
  perftest ib_send_lat send_lat -s "$size" -n "$iters"
  data_line "$out/send_lat.client"
  perftest ib_write_bw write_bw -s "$write_size" -n "$writes" -t "$window"
  data_line "$out/write_bw.client"
  zl=$(awk '/one-way us/ { print $NF }' "$out/zrpc.txt")
  zb=$(awk '/throughput MiB\/s/ { print $3 }' "$out/zrpc.txt")
  pl=$(data_line "$out/send_lat.client" | awk '{ print $5 }')  # t_typical[usec]
  pb=$(data_line "$out/write_bw.client" | awk '{ print $4 }')  # BW average[MiB/sec]
  echo "$zl $pl $zb $pb" >>"$out/rounds"
done

col() { awk -v c="$1" '{ print $c }' "$out/rounds" | median; }
ratio() { awk -v a="$1" -v b="$2" '{ print $a / $b }' "$out/rounds" | median; }
echo "== summary: medians of $rounds rounds (device $ZRPC_RDMA_DEVICE, ${ZRPC_SOFTROCE_MODE:-direct})"
printf 'one-way latency, %s B SEND:   zrpc raw %8.2f us    perftest %8.2f us    ratio %.2f\n' \
  "$size" "$(col 1)" "$(col 2)" "$(ratio 1 2)"
printf 'WRITE throughput, %s B:  zrpc raw %8.2f MiB/s perftest %8.2f MiB/s ratio %.2f\n' \
  "$write_size" "$(col 3)" "$(col 4)" "$(ratio 3 4)"
