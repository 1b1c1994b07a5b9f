#!/usr/bin/env bash
# Configures and builds one configuration:
#   scripts/build.sh [release|asan|tsan]  -> build/, build-asan/ or build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-release}"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
case "$mode" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORUS_WERROR=ON) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug -DTORUS_WERROR=ON -DTORUS_SANITIZE=ON
                               -DTORUS_BUILD_BENCH=OFF -DTORUS_CHECK_LAYERS=OFF) ;;
  tsan) dir=build-tsan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORUS_WERROR=ON -DTORUS_TSAN=ON
                               -DTORUS_BUILD_BENCH=OFF -DTORUS_CHECK_LAYERS=OFF) ;;
  *) echo "usage: $0 [release|asan|tsan]" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
if [ "$mode" = release ]; then
  ninja -C "$dir"
else
  # Unit tests, plus what the multi-process tests that test.sh runs in this configuration need.
  ninja -C "$dir" unit_tests runtime_tests torus_cli
fi
