#!/usr/bin/env bash
# Configures and builds one configuration: scripts/build.sh [release|asan]  -> build/ or build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-release}"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
case "$mode" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORUS_WERROR=ON) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug -DTORUS_WERROR=ON -DTORUS_SANITIZE=ON -DTORUS_BUILD_BENCH=OFF) ;;
  *) echo "usage: $0 [release|asan]" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
if [ "$mode" = asan ]; then
  # Unit tests, plus what the reference-counting multi-process tests need (test.sh).
  ninja -C "$dir" unit_tests runtime_tests torus_cli
else
  ninja -C "$dir"
fi
