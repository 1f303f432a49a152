# What benchmarks/compare.sh and benchmarks/ab.sh share: starting a benchmark server, reading
# the address it listens on, and stopping it; and running a perftest pair (perftest_run). Sourced;
# expects $logs (a directory for logs), and perftest_run $out, $round and the ZRPC_RDMA_*
# variables tools/softroce sets.

# Each system's server is up only while its client runs: zrpc's busy-polling poller takes a
# core, and perftest's clock calibration fails on a guest with a core spinning (it then prints
# inf or zeros); gRPC's threads would disturb the others too.
server=""
trap '[[ -z "$server" ]] || kill "$server" 2>/dev/null || true' EXIT
# start_server NAME PROGRAM ARGS...: sets $server and $target ("listening ADDR:PORT").
#
# The logs of an earlier server of the same NAME are emptied here, before the fork: the
# background child's own truncation of them may come after this shell's first look
# (it did, in CI, in a loaded guest over 9p), and that look then found the earlier server's line,
# whose file was empty by the time it was read again. The line is found and parsed in one read
# for the same reason. The callers run under `set -e`: no read here may fail.
start_server() {
  local name=$1
  shift
  : >"$logs/$name.out"
  : >"$logs/$name.err"
  "$@" >"$logs/$name.out" 2>"$logs/$name.err" &
  server=$!
  local i
  target=""
  for ((i = 0; i < 600; i++)); do
    target=$(awk '/^listening / { print $2; exit }' "$logs/$name.out")
    [[ -n "$target" ]] && break
    kill -0 "$server" 2>/dev/null || { cat "$logs/$name.err" >&2; exit 1; }
    sleep 0.1
  done
  [[ "$target" =~ ^[^:]+:[1-9][0-9]*$ ]] || {
    echo "$(basename "$0"): $name printed no \"listening ADDR:PORT\" line in 60 s;" \
      "it printed: $(head -c 200 "$logs/$name.out")" >&2
    exit 1
  }
}
stop_server() {
  kill -TERM "$server"
  wait "$server" || { echo "$(basename "$0"): $1 failed" >&2; cat "$logs/$1.err" >&2; exit 1; }
  server=""
}

# perftest: its server in the background, then its client, on this device and GID. Each side is
# bounded in time: in a freshly booted guest, `ib_send_lat -e` has hung on both sides with
# nothing printed, now and then, most often in its first run after a busy one (a completion
# event lost in rxe or the guest, not seen on later runs); a hang must cost an attempt, not the
# whole benchmark. A latency run takes seconds; bulk ones, at the sweep's 64 MiB, minutes.
perftest_run() {
  local tool=$1 name=$2
  shift 2
  local common=(-d "$ZRPC_RDMA_DEVICE" -x "$ZRPC_RDMA_GID_INDEX" -p 18515 -F "$@")
  local limit=${PERFTEST_TIMEOUT:-300}
  [[ $tool == ib_send_lat ]] && limit=${PERFTEST_LAT_TIMEOUT:-60}
  local attempt i
  for ((attempt = 0; attempt < 5; attempt++)); do
    timeout -k 5 "$limit" "$tool" "${common[@]}" >"$logs/$name.server" 2>&1 &
    local server=$!
    for ((i = 0; i < 50; i++)); do
      if timeout -k 5 "$limit" "$tool" "${common[@]}" "$ZRPC_RDMA_ADDR" \
          >"$logs/$name.client" 2>&1; then
        break
      fi
      grep -q "Couldn't connect" "$logs/$name.client" || break
      sleep 0.2
    done
    wait "$server" || true
    # Under emulation perftest's clock calibration sometimes fails: it then prints inf, nan, or
    # zeros ("Correlation coefficient r^2 < 0.9"). Such a run is repeated, never used.
    if data_line "$logs/$name.client" | grep -q '^ *[0-9]' &&
       ! data_line "$logs/$name.client" | grep -q -e inf -e nan &&
       data_line "$logs/$name.client" |
         awk '{ for (i = 3; i <= NF; i++) if ($i + 0 > 0) ok = 1 } END { exit !ok }'; then
      return 0
    fi
    echo "(perftest $tool $* gave no finite figures, or hung for $limit s; running it again)"
  done
  # Five hangs in a row (seen once in a run of five rounds): the row is left out of this round,
  # said here and again after the report, and the other rounds carry it (bench_report's
  # "rounds" column counts the rounds each row and ratio has). The whole run is not lost to it.
  cat "$logs/$name.client" >&2
  echo "== MISSING: perftest $tool $* failed $attempt times in round ${round:-of the sweep}: no $name row there" |
    tee -a "$out/missing.txt" >&2
  : >"$logs/$name.client"  # perftest_json then writes no row
}
data_line() { awk '/^ *#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { print; exit }' "$1"; }
