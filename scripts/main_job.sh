#!/usr/bin/env bash
# The main job: builds Torus and its Python package, starts a local simulated TPU cluster
# (`torus up` of a head and three v6e 4x4 slices: 12 node processes, each with the environment GKE
# gives a TPU host), then
#  1. runs the Ray-on-TPU Python program unchanged (`python -m torus.ray`): it reserves one whole
#     v6e 4x4 slice atomically (ray.util.tpu.slice_placement_group), runs one task per host in
#     it, and those tasks join one JAX program (jax.distributed) that all-reduces over the 16
#     devices of the slice;
#  2. runs the same kind of all-reduce as a gang job (`torus job submit --slice 4x4`: one process
#     per host of a whole slice);
#  3. trains a small MLP data-parallel over the 4 hosts of a whole slice with Ray Train's
#     JaxTrainer (`python -m torus.ray examples/jax_train/train_mlp.py`), with checkpoints;
#  4. serves a small JAX transformer behind an OpenAI-compatible /v1/chat/completions with Ray
#     Serve (`python -m torus.ray examples/serve_llm/run.py`): its replica spans the 4 hosts of a
#     whole slice (weights sharded over the 16 devices), queried with the `openai` client;
#  5. runs the plain Ray C++ example as an ordinary job;
# and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release torus_cli example_basic   # only what this job runs: no tests, no benchmarks
PY=$(scripts/python_env.sh .venv-py)   # pip install . (torus) into .venv-py, pinned deps
scripts/jax_venv.sh .venv-py >/dev/null  # CPU JAX, pinned, into the same venv
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
echo "== a Ray program on a reserved v6e 4x4 slice: python -m torus.ray examples/python/tpu_slice_allreduce.py"
# ray.init() finds the cluster `torus up` started (the latest session on this machine).
"$PY" -m torus.ray examples/python/tpu_slice_allreduce.py
echo "== the same all-reduce as a gang job on a whole slice (4 hosts x 2 CPU devices)"
$T job submit --slice 4x4 --accelerator v6e -- \
  env DEVICES_PER_PROCESS=2 "$PY" examples/jax_allreduce/allreduce.py
echo "== Ray Train's JaxTrainer on a whole v6e 4x4 slice: python -m torus.ray examples/jax_train/train_mlp.py"
"$PY" -m torus.ray examples/jax_train/train_mlp.py --steps 30 --storage "$TORUS_TMPDIR/train"
echo "== Ray Data feeding JaxTrainer from Parquet, one disjoint shard per host: python -m torus.ray examples/jax_train/train_mlp_data.py"
"$PY" -m torus.ray examples/jax_train/train_mlp_data.py --storage "$TORUS_TMPDIR/train-data"
echo "== Ray Serve: an OpenAI-compatible model on a whole v6e 4x4 slice: python -m torus.ray examples/serve_llm/run.py"
"$PY" -m torus.ray examples/serve_llm/run.py --port "${SERVE_PORT:-8000}"
echo "== slices after the jobs (the reservations are released)"
$T list slices
echo "== the Ray C++ example as a plain job"
$T job submit -- build/example_basic
