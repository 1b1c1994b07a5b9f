#!/usr/bin/env bash
# The main job: builds Torus, starts a local cluster (a head and two more nodes), runs the
# example program on it (tasks on every node, an actor, objects), prints the results, and stops
# the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-main.XXXXXX)}"
T=build/torus
port=$(( 20000 + RANDOM % 20000 ))
trap '$T stop >/dev/null 2>&1 || true' EXIT
$T start --head --port "$port" --num-cpus 1
$T start --address "127.0.0.1:$port" --num-cpus 1
$T start --address "127.0.0.1:$port" --num-cpus 1
$T status
TORUS_ADDRESS="127.0.0.1:$port" build/example_basic
