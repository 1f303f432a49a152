#!/usr/bin/env bash
# benchmarks/idle_scale.sh: what idle connections cost a server, and what they do to an active
# connection beside them (issue 35). Runs where a device is:
#
#   bazel build -c opt //benchmarks:idle_scale
#   tools/softroce run --timeout 3000 -- benchmarks/idle_scale.sh bazel-bin/benchmarks/idle_scale \
#     [--steps "0 1000"] [--per-process 500] [--seconds 10] [--pollers N] \
#     [--shared-receive-queue R] [--arena-pool N] [--window W] [--arena BYTES] [--max-slots N] \
#     [--keepalive-budget N] [--idle-keepalive S] [--per-channel C] [--settle S] [--rounds R]
#
# One server (idle_scale server: default options but for the flags given and the admission
# limit per address; --pollers N: N pollers, none added), then for each step: idle connections added from client processes of at
# most --per-process connections each until the step's count is open, and one active connection
# (default ChannelOptions, event mode) echoing 64 B one call at a time for --seconds. Prints one
# row per step: connections open, the server's pinned memory (VmPin) and what each idle
# connection adds to it over step 0, the idle clients' pinned memory per connection, the CPU the
# server and the idle clients use while only the idle connections exist (percent of one CPU,
# over 5 s), the keepalive pings the server answered and the idle connections it probed a second
# while the step was measured (checks/s), and the active connection's calls/s and p99 with their
# ratios to step 0 (emulated timings move +-30 %
# between runs: only the ratios within one run mean anything). At the end every idle client says
# how many of its connections were lost; any loss fails the run. --shared-receive-queue,
# --arena-pool, --window and --arena apply to the server and the idle clients alike; without
# them both sides run at their defaults; --idle-keepalive S sets the idle clients'
# ChannelOptions::idle_keepalive_interval (a long one: no idle pings during the run, to see what
# the rest costs); --per-channel C spreads each client's connections over channels of C in one
# poller group (1: a fan-out client, a channel per connection). --settle S waits S seconds after each step's
# connections are up before measuring: a connection made in a storm first checks its server
# within the channel's idle interval (20 s) and stretches to the server's advice (500 s at ten
# thousand) only from its first answer, so the first minutes carry more keepalives than the
# steady state does. --rounds R runs the active connection R times at each step and reports
# the median rate and p99 (each round's figures printed beside the table).
set -euo pipefail
bin=$(readlink -f "$1")
shift
steps="0 1000"
per_process=500
seconds=10
settle=0
rounds=1
shape=()
server_only=()
client_only=()
while (($#)); do
  case "$1" in
    --steps) steps=$2 ;;
    --per-process) per_process=$2 ;;
    --settle) settle=$2 ;;
    --rounds) rounds=$2 ;;
    --seconds) seconds=$2 ;;
    --shared-receive-queue | --arena-pool | --window | --arena) shape+=("$1" "$2") ;;
    --pollers | --max-slots | --keepalive-budget) server_only+=("$1" "$2") ;;
    --idle-keepalive | --per-channel) client_only+=("$1" "$2") ;;
    *)
      echo "idle_scale.sh: unknown argument $1" >&2
      exit 2
      ;;
  esac
  shift 2
done
: "${ZRPC_RDMA_ADDR:?run through tools/softroce}"
tmp=$(mktemp -d)
idle_pids=()
server=
cleanup() {
  for pid in "${idle_pids[@]}" $server; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

port=7472
"$bin" server --port $port "${shape[@]}" "${server_only[@]}" \
  >"$tmp/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do
  grep -q '^listening' "$tmp/server.log" && break
  kill -0 $server 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
  sleep 0.1
done
target=$ZRPC_RDMA_ADDR:$port

# CPU time (in nanoseconds) that processes $@ have run so far: the scheduler's own count per
# thread (/proc/PID/task/TID/schedstat, its first field). Not /proc/PID/stat's user and system
# ticks: those are sampled at the timer tick, and in the emulated guest they charged the idle
# processes, which wake briefly at timer interrupts, three to eight times what perf's task clock
# measured (benchmarks/README, "Idle connections").
cpu_ns() {
  local total=0 pid t ns
  for pid in "$@"; do
    for t in /proc/"$pid"/task/*/schedstat; do
      [[ -r "$t" ]] || continue
      read -r ns _ <"$t" 2>/dev/null || continue
      total=$((total + ns))
    done
  done
  echo $total
}
quiet=5  # seconds over which the idle CPU is measured, before the active connection runs

# The median of the numbers given (the mean of the middle two for an even count).
median() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# The server's latest status line: "open pinned_kib pollers keepalives idle_probes" (the last
# two counted since it started).
server_status() {
  sleep 1.5
  grep '^status' "$tmp/server.log" | tail -n 1 |
    sed -E 's/status open=([0-9]+) pinned_kib=([0-9]+) pollers=([0-9]+) keepalives=([0-9]+) idle_probes=([0-9]+)/\1 \2 \3 \4 \5/'
}

echo "== idle_scale: server with ${shape[*]} ${server_only[*]}; steps: $steps"
printf '%8s %8s %8s %12s %14s %14s %12s %12s %9s %10s %7s %9s %7s\n' idle open pollers server_MiB \
  KiB_per_idle client_KiB/c server_cpu% clients_cpu% checks/s calls/s ratio p99_us ratio
have=0
base_pinned=
base_rate=
base_p99=
client_kib=0
prev=-1
for step in $steps; do
  if ((step <= prev)); then
    echo "idle_scale.sh: --steps must rise (the first is the baseline, usually 0)" >&2
    exit 2
  fi
  prev=$step
  while ((have < step)); do
    n=$((step - have < per_process ? step - have : per_process))
    log="$tmp/idle.$have.log"
    "$bin" idle --connect "$target" --connections $n "${shape[@]}" "${client_only[@]}" >"$log" 2>&1 &
    pid=$!
    idle_pids+=($pid)
    until grep -q '^idle connected' "$log"; do
      kill -0 $pid 2>/dev/null || { echo "idle client failed:" >&2; cat "$log" >&2; exit 1; }
      sleep 0.5
    done
    client_kib=$((client_kib + $(sed -nE 's/.*pinned_kib=([0-9]+).*/\1/p' "$log")))
    have=$((have + n))
  done
  ((step == 0)) || sleep "$settle"
  st=$(server_status)  # (no process substitution: the guest has no /dev/fd)
  if [[ -z "$st" ]]; then
    echo "idle_scale.sh: the server printed no status" >&2
    exit 1
  fi
  read -r open pinned pollers pings_before probes_before <<<"$st"
  measure_start=$(date +%s.%N)

  # What the idle connections cost while nothing else runs: CPU of the server and of the idle
  # clients over $quiet seconds, in percent of one CPU.
  server_before=$(cpu_ns $server)
  clients_before=$(cpu_ns "${idle_pids[@]}")
  sleep $quiet
  server_cpu=$(awk -v a="$(cpu_ns $server)" -v b="$server_before" -v s=$quiet \
    'BEGIN { printf "%.1f", 100 * (a - b) / 1e9 / s }')
  clients_cpu=$(awk -v a="$(cpu_ns "${idle_pids[@]}")" -v b="$clients_before" -v s=$quiet \
    'BEGIN { printf "%.1f", 100 * (a - b) / 1e9 / s }')
  # The active connection, --rounds times: the median rate and the median p99 (a round's rate
  # moved 10-20 % from one to the next in the guest, idle or not).
  rates=() p99s=()
  for ((r = 0; r < rounds; ++r)); do
    active=$("$bin" active --connect "$target" --seconds "$seconds")
    rates+=("$(sed -nE 's/.*calls_per_sec=([0-9.]+).*/\1/p' <<<"$active")")
    p99s+=("$(sed -nE 's/.*p99_us=([0-9.]+).*/\1/p' <<<"$active")")
  done
  # The keepalive pings the server answered (and the idle connections it probed) a second while
  # this step was measured: what the idle connections did beside the active one.
  read -r _ _ _ pings_after probes_after <<<"$(server_status)"
  checks=$(awk -v a="$pings_after" -v b="$pings_before" -v c="$probes_after" -v d="$probes_before" \
    -v s="$measure_start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", (a - b + c - d) / (e - s) }')
  rate=$(median "${rates[@]}")
  p99=$(median "${p99s[@]}")
  ((rounds == 1)) || echo "  rounds at $step idle: calls/s ${rates[*]}; p99_us ${p99s[*]}"
  if [[ -z "$base_pinned" ]]; then
    base_pinned=$pinned base_rate=$rate base_p99=$p99 base_step=$step
  fi
  per_idle=-
  client_per=-
  if ((step > base_step)); then
    per_idle=$(awk -v a="$pinned" -v b="$base_pinned" -v n=$((step - base_step)) \
      'BEGIN { printf "%.1f", (a - b) / n }')
    client_per=$(awk -v a="$client_kib" -v n="$step" 'BEGIN { printf "%.1f", a / n }')
  fi
  printf '%8d %8d %8d %12.1f %14s %14s %12s %12s %9s %10.0f %7.2f %9.1f %7.2f\n' "$step" "$open" "$pollers" \
    "$(awk -v k="$pinned" 'BEGIN { print k / 1024 }')" "$per_idle" "$client_per" "$server_cpu" \
    "$clients_cpu" "$checks" "$rate" \
    "$(awk -v a="$rate" -v b="$base_rate" 'BEGIN { print a / b }')" "$p99" \
    "$(awk -v a="$p99" -v b="$base_p99" 'BEGIN { print a / b }')"
done

failed=0
for pid in "${idle_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${idle_pids[@]}"; do wait "$pid" || failed=1; done
idle_pids=()
lost=$(cat "$tmp"/idle.*.log 2>/dev/null | sed -nE 's/^idle lost=([0-9]+).*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
# Keepalive probes of the idle clients over the run: their count, failures, and the worst of the
# processes' p99 (target: below 1,000 ms, half the keepalive_timeout).
probes=$(cat "$tmp"/idle.*.log 2>/dev/null | sed -nE 's/^idle .* pings=([0-9]+) pings_failed=([0-9]+) ping_p99_ms=([0-9.]+).*/\1 \2 \3/p' |
  awk '{ n += $1; f += $2; if ($3 > p) p = $3 } END { printf "%d probes, %d failed, worst p99 %.1f ms (target: below 1000 ms)", n, f, p }')
echo "idle connections lost: $lost; keepalive $probes"
((failed == 0 && lost == 0))
