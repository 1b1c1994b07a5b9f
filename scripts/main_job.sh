#!/usr/bin/env bash
# The main job: builds Torus, starts a local simulated TPU cluster (a head and two v6e 4x4 slices:
# 8 node processes, each with the environment GKE gives a TPU host), submits a JAX program as a
# gang job on one whole 4x4 slice (`torus job submit --slice 4x4 --accelerator v6e`: one process
# per host, started by that host's node, joined by jax.distributed, one all-reduce over every
# device of the slice), prints its result, then runs the plain Ray C++ example as an ordinary
# job, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release
PY=$(scripts/jax_venv.sh)   # CPU JAX, pinned, in .venv-jax
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-main.XXXXXX)}"
export TORUS_TPU_METADATA_URL=off   # no GCE metadata server here
T=build/torus

# The example cluster. Stands in for `torus up examples/clusters/v6e-4x4.yaml` / `torus down`,
# which will replace these two functions.
cluster_up() {
  local port=$(( 20000 + RANDOM % 20000 ))
  $T start --head --port "$port" --num-cpus 1 >/dev/null
  for s in 0 1; do
    for w in 0 1 2 3; do
      TPU_NAME="tpu-group-$s" TPU_WORKER_ID="$w" TPU_ACCELERATOR_TYPE=v6e-16 TPU_TOPOLOGY=4x4 \
      TPU_WORKER_HOSTNAMES="tpu-group-$s-0,tpu-group-$s-1,tpu-group-$s-2,tpu-group-$s-3" \
      TORUS_TPU_CHIPS=4 $T start --address "127.0.0.1:$port" --num-cpus 1 >/dev/null
    done
  done
  export TORUS_ADDRESS="127.0.0.1:$port"
}
cluster_down() { $T stop >/dev/null 2>&1 || true; }

trap cluster_down EXIT
cluster_up
$T list slices
echo "== JAX all-reduce on a reserved v6e 4x4 slice (4 hosts x 2 CPU devices)"
$T job submit --slice 4x4 --accelerator v6e -- \
  env DEVICES_PER_PROCESS=2 "$PY" examples/jax_allreduce/allreduce.py
echo "== slices after the job (the reservation is released)"
$T list slices
echo "== the Ray C++ example as a plain job"
$T job submit -- build/example_basic
