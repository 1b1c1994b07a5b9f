#!/usr/bin/env bash
# The main job: builds Torus, starts a local simulated TPU cluster (`torus up` of a head and three v6e 4x4
# slices: 12 node processes, each with the environment GKE gives a TPU host), submits a JAX program as a
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

# The example cluster: a head and three v6e 4x4 slices (12 hosts), each host a node process with
# the environment GKE and the TPU webhook give it (docs/launcher.md).
cluster_up() { $T up examples/clusters/v6e-4x4-3-slices.yaml --wait >/dev/null; }
cluster_down() { $T down >/dev/null 2>&1 || true; }

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
