# Sourced by the benchmark programs' shell tests (after tests/junit.sh): expect_usage_errors
# PROGRAM NAME ARGV... runs PROGRAM with each ARGV (one string, split on spaces) and records a
# junit problem unless it exits 2 and prints "usage: NAME". Uses $tmp for its output.
expect_usage_errors() {
  local program=$1 name=$2 argv rc
  shift 2
  for argv in "$@"; do
    rc=0
    # shellcheck disable=SC2086  # word splitting is the point
    "$program" $argv >"$tmp/args.out" 2>&1 || rc=$?
    ((rc == 2)) || junit_problem "\"$name $argv\" exited $rc, want 2: $(cat "$tmp/args.out")"
    grep -q "^usage: $name" "$tmp/args.out" || junit_problem "\"$name $argv\" printed no usage"
  done
}
# expect_help PROGRAM NAME: "--help" and "-h" print the usage on stdout and exit 0.
expect_help() {
  local program=$1 name=$2 flag rc
  for flag in --help -h; do
    rc=0
    "$program" "$flag" >"$tmp/help.out" 2>"$tmp/help.err" || rc=$?
    ((rc == 0)) || junit_problem "\"$name $flag\" exited $rc, want 0: $(cat "$tmp/help.err")"
    grep -q "^usage: $name" "$tmp/help.out" || junit_problem "\"$name $flag\" printed no usage"
  done
}
