#!/usr/bin/env bash
# The outside-project test (issue 2, "Done when"): install Torus from BUILD_DIR into a fresh
# prefix, build EXAMPLE_DIR (examples/basic) as a standalone CMake project that only knows
# find_package(Torus), then run it
#   1. on the embedded default (no address): a private cluster that Shutdown() stops, and
#   2. against `torus start --head` plus two `torus start --address` nodes, using the INSTALLED
#      bin/torus, in a private TORUS_TMPDIR on a free port,
# checking its output, that tasks ran on every node, and that nothing is left running.
#
# usage: outside_project_test.sh BUILD_DIR EXAMPLE_DIR
set -euo pipefail

build_dir=$(cd "$1" && pwd)
example_dir=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/torus-outside.XXXXXX)
prefix="$work/prefix"
export TORUS_TMPDIR="$work/tmp"
mkdir -p "$TORUS_TMPDIR"
unset TORUS_ADDRESS RAY_ADDRESS TORUS_TOKEN TORUS_BIN
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
step() { echo; echo "== $*"; }

# Live processes (not zombies) whose environment carries our TORUS_TMPDIR.
our_processes() {
  local p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    if cat "$p/environ" 2>/dev/null | tr '\0' '\n' | grep -qxF "TORUS_TMPDIR=$TORUS_TMPDIR"; then
      state=$(awk '{print $3}' "$p/stat" 2>/dev/null || echo Z)
      [ "$state" != "Z" ] && [ -n "$state" ] && echo "${p#/proc/}"
    fi
  done
  return 0
}

cleanup() {
  if [ -x "$prefix/bin/torus" ]; then "$prefix/bin/torus" stop >/dev/null 2>&1 || true; fi
  local left
  left=$(our_processes)
  [ -n "$left" ] && kill -9 $left 2>/dev/null || true
  if [ -z "${TORUS_TEST_KEEP_TMP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT

wait_no_processes() {  # $1: what
  local i left
  for i in $(seq 1 50); do
    left=$(our_processes)
    [ -z "$left" ] && return 0
    sleep 0.2
  done
  for p in $left; do echo "  left: pid $p $(cat /proc/$p/cmdline 2>/dev/null | tr '\0' ' ')"; done
  fail "$1: processes left running"
}

free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
  else
    echo $((20000 + RANDOM % 20000))
  fi
}

check_output() {  # $1: file, $2: expected nodes_used
  local f=$1
  grep -qx 'put_get_result = 100' "$f" || fail "put_get_result = 100 missing"
  grep -qx 'task_result = 3' "$f" || fail "task_result = 3 missing"
  grep -qx 'actor_result = 3' "$f" || fail "actor_result = 3 missing"
  grep -qx 'actor_result_with_ref = 6' "$f" || fail "actor_result_with_ref = 6 missing"
  grep -qx "nodes_used = $2" "$f" || fail "expected nodes_used = $2, got: $(grep nodes_used "$f" || echo none)"
}

step "install $build_dir into $prefix"
cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log"
[ -x "$prefix/bin/torus" ] || fail "bin/torus not installed"
ls "$prefix"/lib*/libtorus.so* >/dev/null 2>&1 || fail "libtorus not installed"
[ -f "$prefix/include/ray/api.h" ] || fail "include/ray/api.h not installed"
ls "$prefix"/lib*/cmake/Torus/TorusConfig.cmake >/dev/null 2>&1 || fail "CMake package not installed"
[ -e "$prefix/include/common" ] && fail "internal headers (src/common) were installed"

step "configure and build $example_dir against the installed package only"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$example_dir" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "configure failed"; exit 1; }
grep -q "Torus_DIR:PATH=$prefix" "$work/build/CMakeCache.txt" \
  || fail "find_package(Torus) did not find the installed package: $(grep Torus_DIR "$work/build/CMakeCache.txt")"
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build failed"; exit 1; }
program="$work/build/basic"
[ -x "$program" ] || { fail "no program built"; exit 1; }
lib=$(ldd "$program" | awk '/libtorus/ {print $3}')
case "$lib" in
  "$prefix"/*) ;;
  *) fail "the program loads libtorus from '$lib', not from the installed prefix";;
esac
shm_before=$(ls /dev/shm | grep -c '^torus\.' || true)

step "run on the embedded default"
if timeout 120 "$program" > "$work/embedded.out" 2> "$work/embedded.err"; then
  cat "$work/embedded.out"
  check_output "$work/embedded.out" 1
else
  cat "$work/embedded.out" "$work/embedded.err"; fail "the program failed on the embedded default"
fi
wait_no_processes "embedded default"
shm_after=$(ls /dev/shm | grep -c '^torus\.' || true)
[ "$shm_after" -le "$shm_before" ] || fail "embedded default left /dev/shm/torus.* segments ($shm_before before, $shm_after after)"
ls "$TORUS_TMPDIR" | grep -q '^session_' && fail "embedded default left a session directory in $TORUS_TMPDIR"

step "run against torus start --head + 2 x torus start --address (installed bin/torus)"
T="$prefix/bin/torus"
port=$(free_port)
"$T" start --head --port "$port" --num-cpus 1 || { fail "torus start --head failed"; exit 1; }
"$T" start --address "127.0.0.1:$port" --num-cpus 1 || fail "first torus start --address failed"
"$T" start --address "127.0.0.1:$port" --num-cpus 1 || fail "second torus start --address failed"
"$T" status | tee "$work/status.out"
grep -q "3 alive" "$work/status.out" || fail "torus status does not show 3 alive nodes"
if TORUS_ADDRESS="127.0.0.1:$port" timeout 120 "$program" > "$work/cluster.out" 2> "$work/cluster.err"; then
  cat "$work/cluster.out"
  check_output "$work/cluster.out" 3
else
  cat "$work/cluster.out" "$work/cluster.err"; fail "the program failed on the cluster"
fi
"$T" stop
wait_no_processes "torus stop"

echo
if [ "$failures" -ne 0 ]; then
  echo "outside_project_test: $failures failure(s)"
  exit 1
fi
echo "outside_project_test: OK"
