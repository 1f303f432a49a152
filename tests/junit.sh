# Sourced by shell tests: JUnit XML the way tests/catch_main.cc writes it, so tools/test counts
# each case as passed, failed or skipped (never a skip as a pass), and the device check every
# RDMA shell test starts with.
#
#   source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/junit.sh"
#   junit_init SUITE                      # the suite's name (the test's)
#   junit_require_device "case name"      # no device and not in tools/softroce: SKIPPED, exit 0
#   junit_record NAME pass|fail|skip SECONDS [DETAIL]
#   junit_finish                          # writes $XML_OUTPUT_FILE; exit status 1 if any failed

junit_suite=""
junit_cases=""
junit_failed=0

junit_init() { junit_suite=$1; }

junit_escape() { sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g'; }

junit_record() {
  local name detail
  name=$(printf '%s' "$1" | junit_escape)
  detail=$(printf '%s' "${4:-}" | junit_escape)
  local head="  <testcase name=\"$name\" classname=\"$junit_suite\" time=\"$3\""
  case $2 in
    pass) junit_cases+="$head/>"$'\n' ;;
    skip) junit_cases+="$head><skipped message=\"$detail\"/></testcase>"$'\n' ;;
    fail) junit_cases+="$head><failure message=\"failed\">$detail</failure></testcase>"$'\n'
          junit_failed=1 ;;
  esac
}

junit_write() {
  [[ -n "${XML_OUTPUT_FILE:-}" ]] || return 0
  local tests failures skipped
  tests=$(grep -c '<testcase' <<<"$junit_cases")
  failures=$(grep -c '<failure' <<<"$junit_cases")
  skipped=$(grep -c '<skipped' <<<"$junit_cases")
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n<testsuite name="%s" tests="%s" failures="%s" skipped="%s" errors="0">\n%s</testsuite>\n</testsuites>\n' \
    "$junit_suite" "$tests" "$failures" "$skipped" "$junit_cases" >"$XML_OUTPUT_FILE"
}

junit_finish() {
  junit_write
  if ((junit_failed)); then
    echo "FAILED: $junit_suite"
    exit 1
  fi
  exit 0
}

junit_require_device() {
  [[ -n "${ZRPC_RDMA_ADDR:-}" ]] && return 0
  if [[ -z "${ZRPC_SOFTROCE_MODE:-}" ]]; then
    local reason="needs an RDMA device: run it through tools/softroce (tools/test does), or set ZRPC_RDMA_ADDR to an address on your RDMA device"
    printf '\n*** SKIPPED: %s: %s\n\n' "$junit_suite" "$reason" >&2
    junit_record "$1" skip 0 "$reason"
    junit_write
    exit 0
  fi
  echo "FAILED: inside tools/softroce (ZRPC_SOFTROCE_MODE=$ZRPC_SOFTROCE_MODE) but ZRPC_RDMA_ADDR is unset"
  exit 1
}

# junit_scenario NAME FUNCTION [ARGS...]: runs FUNCTION ARGS, which calls junit_problem for each thing that went
# wrong, and records NAME as failed (with the problems) or passed.
junit_problems=""
junit_problem() {
  echo "  PROBLEM: $*"
  junit_problems+="$*"$'\n'
}
junit_scenario() {
  echo "== $1"
  junit_problems=""
  local start=$SECONDS
  "${@:2}"
  if [[ -n "$junit_problems" ]]; then
    junit_record "$1" fail $((SECONDS - start)) "$junit_problems"
  else
    junit_record "$1" pass $((SECONDS - start))
  fi
}
