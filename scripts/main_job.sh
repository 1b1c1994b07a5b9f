#!/usr/bin/env bash
# The main job: builds Torus, starts a local simulated TPU cluster (a head, and two v6e 4x4 slices:
# 8 node processes, each with the environment GKE gives a TPU host), reserves one whole slice
# atomically, runs one worker per host of it, prints the combined result, and stops the cluster.
# Then runs the plain Ray C++ example (tasks, an actor, objects) on the same cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-main.XXXXXX)}"
export TORUS_TPU_METADATA_URL=off   # no GCE metadata server here
T=build/torus
port=$(( 20000 + RANDOM % 20000 ))
trap '$T stop >/dev/null 2>&1 || true' EXIT
$T start --head --port "$port" --num-cpus 1
for s in 0 1; do
  for w in 0 1 2 3; do
    TPU_NAME="tpu-group-$s" TPU_WORKER_ID="$w" TPU_ACCELERATOR_TYPE=v6e-16 TPU_TOPOLOGY=4x4 \
    TPU_WORKER_HOSTNAMES="tpu-group-$s-0,tpu-group-$s-1,tpu-group-$s-2,tpu-group-$s-3" \
    TORUS_TPU_CHIPS=4 $T start --address "127.0.0.1:$port" --num-cpus 1 >/dev/null
  done
done
$T list slices
TORUS_ADDRESS="127.0.0.1:$port" build/example_tpu_slice
TORUS_ADDRESS="127.0.0.1:$port" build/example_basic
