# What benchmarks/compare.sh and benchmarks/ab.sh share: starting a benchmark server, reading
# the address it listens on, and stopping it. Sourced; expects $logs (a directory for logs).

# Each system's server is up only while its client runs: zrpc's busy-polling poller takes a
# core, and perftest's clock calibration fails on a guest with a core spinning (it then prints
# inf or zeros); gRPC's threads would disturb the others too.
server=""
trap '[[ -z "$server" ]] || kill "$server" 2>/dev/null || true' EXIT
# start_server NAME PROGRAM ARGS...: sets $server and $target ("listening ADDR:PORT").
start_server() {
  local name=$1
  shift
  "$@" >"$logs/$name.out" 2>"$logs/$name.err" &
  server=$!
  local i
  for ((i = 0; i < 600; i++)); do
    grep -q '^listening ' "$logs/$name.out" && break
    kill -0 "$server" 2>/dev/null || { cat "$logs/$name.err" >&2; exit 1; }
    sleep 0.1
  done
  target=$(awk '/^listening / { print $2; exit }' "$logs/$name.out")
  [[ -n "$target" ]] || { echo "$(basename "$0"): $name did not start" >&2; exit 1; }
}
stop_server() {
  kill -TERM "$server"
  wait "$server" || { echo "$(basename "$0"): $1 failed" >&2; cat "$logs/$1.err" >&2; exit 1; }
  server=""
}

