#!/usr/bin/env bash
# The Python test environment: a virtual environment (default .venv-py, or $1) with the pinned
# test requirements (python/requirements-test.txt) and this repository installed by
# `pip install .` (scikit-build-core + CMake; ccache serves the objects the C++ builds compiled,
# and build-python/ keeps the CMake tree between runs). Prints the interpreter's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-py}"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR=1
# The compiler scripts/build.sh's CMake picks (c++), not the one Python was built with (pip would
# pass sysconfig's g++): same compile commands, so ccache serves the release build's objects.
export CXX="${CXX:-c++}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r python/requirements-test.txt >&2
# Build isolation off: the pinned build requirements are installed here once, not per build.
"$venv/bin/pip" install -q --disable-pip-version-check "scikit-build-core==1.1.2" "nanobind==3.1.0" >&2
# Warnings are errors here as in scripts/build.sh (a developer and CI build), which also keeps
# the compile commands identical to the release build's (unity or not, as scripts/build.sh), so
# ccache serves its objects.
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
  --config-settings=cmake.define.TORUS_WERROR=ON \
  --config-settings=cmake.define.CMAKE_UNITY_BUILD="${TORUS_UNITY:-ON}" . >&2
case "$venv" in /*) echo "$venv/bin/python" ;; *) echo "$PWD/$venv/bin/python" ;; esac
