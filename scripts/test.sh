#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, checks the layers' includes
# and the size budget, builds the release and the
# ASan+UBSan configurations once each, checks the lock annotations with clang (tsa.sh), runs
# unit tests in both, the object and borrowing multi-process tests under ASan+UBSan, and every
# multi-process test in the release build.
# With TORUS_CI_TSAN=1 it also builds the ThreadSanitizer configuration and runs the unit tests
# and the task, object, borrowing and actor multi-process tests under it (off until a full TSan
# run is clean: see scripts/tsan.supp).
# Every stage prints its duration when the suite ends (also on failure), and the total.
set -euo pipefail
cd "$(dirname "$0")/.."

timings=()
start_all=$(date +%s)
report() {
  local rc=$? t
  echo
  echo "== stage durations"
  for t in "${timings[@]}"; do echo "$t"; done
  t=$(( $(date +%s) - start_all ))
  printf '  %-62s %3dm%02ds\n' "total" $((t / 60)) $((t % 60))
  exit "$rc"
}
trap report EXIT
# stage NAME COMMAND...: runs COMMAND, records how long it took (also when it fails).
stage() {
  local name=$1 t0 rc=0 t
  shift
  echo "== $name"
  t0=$(date +%s)
  "$@" || rc=$?
  t=$(( $(date +%s) - t0 ))
  timings+=("$(printf '  %-62s %3dm%02ds%s' "$name" $((t / 60)) $((t % 60)) "$([ "$rc" = 0 ] || echo "  FAILED")")")
  return "$rc"
}

stage "dependencies" scripts/deps.sh
stage "layers (#include order)" scripts/check_layers.sh
stage "sizes (files <= 800 lines, functions <= 80)" scripts/check_sizes.sh
stage "build release" scripts/build.sh release
stage "build asan" scripts/build.sh asan
stage "tsa (clang -Wthread-safety)" scripts/tsa.sh build
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-test.XXXXXX)}"

# TSan: every process (the test, the daemons it starts, their workers) writes its reports to
# $tsan_logs/tsan.<pid>; a stage fails when any report was written.
tsan_logs=$(mktemp -d /tmp/torus-tsan.XXXXXX)
tsan() {
  TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp log_path=$tsan_logs/tsan second_deadlock_stack=1 die_after_fork=0" "$@" || return
  if grep -l 'ThreadSanitizer' "$tsan_logs"/tsan.* >/dev/null 2>&1; then
    cat "$tsan_logs"/tsan.*
    echo "ThreadSanitizer: $(cat "$tsan_logs"/tsan.* | grep -c '^WARNING: ThreadSanitizer') report(s) (above)"
    return 1
  fi
}
asan() { ASAN_OPTIONS=detect_leaks=0 "$@"; }

stage "unit tests (ASan+UBSan)" asan ctest --test-dir build-asan -L unit --output-on-failure -j2
stage "object and reference-counting multi-process tests (ASan+UBSan)" \
  asan ctest --test-dir build-asan -L integration \
  -R '^(BorrowTest|TaskTest|ObjectTest)\.' --output-on-failure -j1 --timeout 600
if [ "${TORUS_CI_TSAN:-0}" = 1 ]; then
  stage "build tsan" scripts/build.sh tsan
  stage "unit tests (TSan)" tsan ctest --test-dir build-tsan -L unit --output-on-failure -j2
  stage "task, object, borrowing and actor multi-process tests (TSan)" \
    tsan ctest --test-dir build-tsan -L integration \
    -R '^(TaskTest|ObjectTest|BorrowTest|ActorTest)\.' --output-on-failure -j1 --timeout 600
fi
stage "unit and multi-process tests (release)" \
  ctest --test-dir build --output-on-failure -j1 --timeout 600
