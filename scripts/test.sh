#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds the release, the
# ASan+UBSan configurations once each, runs unit tests in both, the object and borrowing
# multi-process tests under ASan+UBSan, and every multi-process test in the release build.
# With TORUS_CI_TSAN=1 it also builds the ThreadSanitizer configuration and runs the unit tests
# and the task, object, borrowing and actor multi-process tests under it (off until a full TSan
# run is clean: see scripts/tsan.supp).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release
scripts/build.sh asan
echo "== tsa: clang -Wthread-safety over src/ (compile only)"
scripts/tsa.sh build
if [ "${TORUS_CI_TSAN:-0}" = 1 ]; then scripts/build.sh tsan; fi
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-test.XXXXXX)}"

# TSan: every process (the test, the daemons it starts, their workers) writes its reports to
# $tsan_logs/tsan.<pid>; a stage fails when any report was written.
tsan_logs=$(mktemp -d /tmp/torus-tsan.XXXXXX)
tsan_env=(env "TSAN_OPTIONS=suppressions=$PWD/scripts/tsan.supp log_path=$tsan_logs/tsan second_deadlock_stack=1 die_after_fork=0")
tsan_check() {
  if grep -l 'ThreadSanitizer' "$tsan_logs"/tsan.* >/dev/null 2>&1; then
    cat "$tsan_logs"/tsan.*
    echo "ThreadSanitizer reported $(cat "$tsan_logs"/tsan.* | grep -c '^WARNING: ThreadSanitizer') problem(s) (above)"
    return 1
  fi
}

echo "== unit tests (ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan -L unit --output-on-failure -j2
echo "== object and reference-counting multi-process tests (ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan -L integration \
  -R '^(BorrowTest|TaskTest|ObjectTest)\.' --output-on-failure -j1 --timeout 600
if [ "${TORUS_CI_TSAN:-0}" = 1 ]; then
  echo "== unit tests (TSan)"
  "${tsan_env[@]}" ctest --test-dir build-tsan -L unit --output-on-failure -j2
  tsan_check
  echo "== task, object, reference-counting and actor multi-process tests (TSan)"
  "${tsan_env[@]}" ctest --test-dir build-tsan -L integration \
    -R '^(TaskTest|ObjectTest|BorrowTest|ActorTest)\.' --output-on-failure -j1 --timeout 600
  tsan_check
fi
echo "== unit and multi-process tests (release)"
ctest --test-dir build --output-on-failure -j1 --timeout 600
