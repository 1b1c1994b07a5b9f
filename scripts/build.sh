#!/usr/bin/env bash
# Configures and builds one configuration:
#   scripts/build.sh [release|asan|tsan] [TARGET...]  -> build/, build-asan/ or build-tsan/
# Without targets: everything (release) or what test.sh runs in that configuration (asan, tsan).
# Unity build (CMAKE_UNITY_BUILD, batches of 8 sources): a cold build takes about a third of the
# time, since each batch parses the gRPC/protobuf headers once; TORUS_UNITY=OFF compiles file by
# file, which rebuilds less after an edit (scripts/python_env.sh follows the same setting, so
# ccache serves it the release objects).
# ccache: CCACHE_BASEDIR turns the paths under this clone into relative ones and CCACHE_NOHASHDIR
# keeps the working directory (which -g records) out of the hash, so a clean clone in another
# directory hits the objects another clone left in the same CCACHE_DIR (default .cache/ccache of
# this clone; CI can point CCACHE_DIR at one persistent directory).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-release}"
[ $# -gt 0 ] && shift
unity="${TORUS_UNITY:-ON}"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR=1
case "$mode" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORUS_WERROR=ON) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug -DTORUS_WERROR=ON -DTORUS_SANITIZE=ON
                               -DTORUS_BUILD_BENCH=OFF -DTORUS_CHECK_LAYERS=OFF) ;;
  tsan) dir=build-tsan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORUS_WERROR=ON -DTORUS_TSAN=ON
                               -DTORUS_BUILD_BENCH=OFF -DTORUS_CHECK_LAYERS=OFF) ;;
  *) echo "usage: $0 [release|asan|tsan]" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja "${flags[@]}" -DCMAKE_UNITY_BUILD="$unity" >/dev/null
if [ $# -gt 0 ]; then
  ninja -C "$dir" "$@"
elif [ "$mode" = release ]; then
  ninja -C "$dir"
else
  # Unit tests, plus what the multi-process tests that test.sh runs in this configuration need.
  ninja -C "$dir" unit_tests runtime_tests torus_cli
fi
