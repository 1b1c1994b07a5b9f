#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds the release and the
# ASan+UBSan configurations once each, runs unit tests in both, the object and borrowing
# multi-process tests under ASan+UBSan, and every multi-process test in the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release
scripts/build.sh asan
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-test.XXXXXX)}"
echo "== unit tests (ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan -L unit --output-on-failure -j2
echo "== object and reference-counting multi-process tests (ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan -L integration \
  -R '^(BorrowTest|TaskTest|ObjectTest)\.' --output-on-failure -j1 --timeout 600
echo "== unit and multi-process tests (release)"
ctest --test-dir build --output-on-failure -j1 --timeout 600
