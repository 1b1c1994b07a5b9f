#!/usr/bin/env bash
# JaxTrainer group start and restart-after-SIGKILL (bench/train_latency.py), Torus against
# Ray 2.60 on this machine, one after the other:
#   torus-slice  Torus, a whole simulated v6e 4x4 slice of `torus up` (4 node processes)
#   ray-slice    Ray, four raylets on this machine carrying what GKE gives a v6e 4x4 slice's
#                hosts (TPU: 4 each, the slice head resource on worker 0, ray.io/tpu-* labels)
#   torus-cpu    Torus, 4 workers of 1 CPU (`torus start --head --num-cpus 4`)
#   ray-cpu      Ray, the same on `ray start --head --num-cpus 4`
# Usage: bench/train_compare.sh RAY_VENV [ROUNDS (5)]
#   RAY_VENV: pip install "ray[train]==2.60.0" jax==0.4.38 jaxlib==0.4.38 (Ray's setup imports jax);
#   a ~/.ray/auth_token makes Ray's extra raylets fail with InvalidAuthToken: move it aside.
set -u
cd "$(dirname "$0")/.."
RAYPY="$1/bin/python" RAY="$1/bin/ray" ROUNDS=${2:-5}
PY=.venv-py/bin/python T=build/torus
export TORUS_TPU_METADATA_URL=off RAY_TRAIN_V2_ENABLED=1
run() { echo "## $1"; shift; "$@" 2>/dev/null | grep '^{'; }

root=$(mktemp -d /tmp/train-cmp.XXXXXX); chmod 700 "$root"
sed 's/replicas: 3/replicas: 1/; s/maxReplicas: 3/maxReplicas: 1/' \
  examples/clusters/v6e-4x4-3-slices.yaml > "$root/v6e.yaml"
TORUS_TMPDIR=$root $T up "$root/v6e.yaml" --wait >/dev/null
TORUS_TMPDIR=$root run torus-slice $PY -m torus.ray bench/train_latency.py --tpu --rounds "$ROUNDS"
TORUS_TMPDIR=$root $T down >/dev/null

$RAY stop --force >/dev/null 2>&1
lab() { echo "ray.io/tpu-slice-name=sim-slice,ray.io/tpu-worker-id=$1,ray.io/tpu-topology=4x4,ray.io/accelerator-type=TPU-V6E,ray.io/tpu-pod-type=v6e-16"; }
tenv() { echo "JAX_PLATFORMS=cpu TPU_NAME=sim-slice TPU_WORKER_ID=$1 TPU_ACCELERATOR_TYPE=v6e-16 TPU_TOPOLOGY=4x4 TPU_WORKER_HOSTNAMES=h0,h1,h2,h3"; }
env $(tenv 0) $RAY start --head --port 6390 --num-cpus 1 --resources '{"TPU": 4, "TPU-v6e-16-head": 1, "accelerator_type:TPU-V6E": 1}' \
  --labels "$(lab 0)" --disable-usage-stats >/dev/null 2>&1
for w in 1 2 3; do
  env $(tenv $w) $RAY start --address "$(hostname -I | cut -d" " -f1):6390" --num-cpus 1 --resources '{"TPU": 4, "accelerator_type:TPU-V6E": 1}' \
    --labels "$(lab $w)" >/dev/null 2>&1
done
RAY_ADDRESS=auto run ray-slice $RAYPY bench/train_latency.py --tpu --rounds "$ROUNDS"
$RAY stop --force >/dev/null 2>&1

TORUS_TMPDIR=$root $T start --head --new-session --port 7390 --num-cpus 4 >/dev/null
TORUS_TMPDIR=$root run torus-cpu $PY -m torus.ray bench/train_latency.py --rounds "$ROUNDS"
TORUS_TMPDIR=$root $T stop >/dev/null

$RAY start --head --port 6390 --num-cpus 4 --disable-usage-stats >/dev/null 2>&1
RAY_ADDRESS=auto run ray-cpu $RAYPY bench/train_latency.py --rounds "$ROUNDS"
$RAY stop --force >/dev/null 2>&1
rm -rf "$root"
