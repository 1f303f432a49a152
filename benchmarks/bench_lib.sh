# What benchmarks/compare.sh and benchmarks/ab.sh share: starting a benchmark server, reading
# the address it listens on, and stopping it. Sourced; expects $logs (a directory for logs).

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

