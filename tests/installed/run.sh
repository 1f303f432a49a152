#!/usr/bin/env bash
# tests/installed/run.sh: zrpc installed with tools/install, used by a CMake project and by a
# Makefile with pkg-config (the README's "From a CMake project" and "With pkg-config", verbatim).
#
#   run.sh build WORK   installs zrpc into WORK/prefix (CMake build in WORK/zrpc-build), builds
#                       this directory's CMakeLists.txt and Makefile against it (copies in WORK),
#                       and checks the README's blocks are these files' lines;
#   run.sh rdma WORK    runs both builds' echo_check over the RDMA device, through
#                       `tools/softroce exec` (ZRPC_SOFTROCE_SESSION names the session).
#
# One verdict a step, "INSTALLED PASS name", "INSTALLED FAIL name" or "INSTALLED SKIP name"
# (tools/test_summary.py counts them), with what failed above it. Exit status 0 when none failed.
# tools/test runs both; "build" needs nothing but tools/install-deps --library's packages.
set -uo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
root=$(cd "$here/../.." && pwd)
mode=${1:?usage: run.sh build|rdma WORK}
work=${2:?usage: run.sh build|rdma WORK}
mkdir -p "$work"
work=$(cd "$work" && pwd)
failed=0
verdict() {  # verdict NAME STATUS [why]: STATUS 0 pass, 77 skip, else fail
  case "$2" in
    0) echo "INSTALLED PASS $1" ;;
    77) echo "SKIPPED: $1: ${3:-}"; echo "INSTALLED SKIP $1" ;;
    *) echo "INSTALLED FAIL $1"; failed=1 ;;
  esac
}
# step NAME LOG COMMAND...: runs COMMAND with its output in LOG, shown when it fails.
step() {
  local name=$1 log=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  ((rc == 0)) || { echo "$name failed ($rc): $*"; tail -n 40 "$log"; }
  verdict "$name" "$rc"
  return "$rc"
}

if [[ "$mode" == build ]]; then
  prefix=$work/prefix
  sources=("$here"/{CMakeLists.txt,Makefile,echo.proto,echo_check.cc})
  rm -rf "$prefix" "$work/cmake-app" "$work/make-app"
  # No optimisation or debug information: the quickest build that checks the same sources.
  if step install "$work/install.log" "$root/tools/install" --prefix "$prefix" \
      --build-dir "$work/zrpc-build" -DZRPC_WERROR=ON -DCMAKE_BUILD_TYPE=None; then
    # The project's own files only: a build left in the tree would make make say "up to date".
    mkdir -p "$work/cmake-app" "$work/make-app"
    cp "${sources[@]}" "$work/cmake-app"
    step cmake-consumer "$work/cmake-app.log" sh -c "cd '$work/cmake-app' &&
      cmake -S . -B build -DCMAKE_PREFIX_PATH='$prefix' -DCMAKE_CXX_FLAGS=-Werror &&
      cmake --build build --parallel $(nproc)"
    cp "${sources[@]}" "$work/make-app"
    step pkgconfig-consumer "$work/make-app.log" env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
      CXXFLAGS=-Werror sh -c "pkg-config --validate zrpc && make -C '$work/make-app' -j$(nproc)"
  else
    verdict cmake-consumer 1
    verdict pkgconfig-consumer 1
  fi
  step readme-recipes "$work/recipes.log" python3 "$here/recipes.py" "$root/README.md" "$here"
elif [[ "$mode" == rdma ]]; then
  for app in cmake-app/build make-app; do
    name=${app%%-app*}-echo-over-rdma
    [[ $app == make-app ]] && name=pkgconfig-echo-over-rdma
    if [[ ! -x "$work/$app/echo_check" ]]; then
      echo "$work/$app/echo_check was not built (run.sh build failed)"
      verdict "$name" 1
      continue
    fi
    step "$name" "$work/$name.log" "$root/tools/softroce" exec -- "$work/$app/echo_check" &&
      cat "$work/$name.log"
  done
else
  echo "usage: run.sh build|rdma WORK" >&2
  exit 2
fi
exit "$failed"
