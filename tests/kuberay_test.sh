#!/usr/bin/env bash
# KubeRay conformance (docs/kuberay.md): builds tests/kuberay/operator on KubeRay v1.5.0's own
# operator module (from the Go module proxy), lets its RayClusterReconciler make the pods of each
# example RayCluster, runs them as a kubelet would (tests/kuberay/pods.py: own network, mount,
# UTS and PID namespaces, init containers, KubeRay's probes, GKE's TPU webhook), runs a Ray
# program in the head pod, kills a worker pod, has the operator recreate it, and checks that it
# rejoins (the program passes again); on the CPU cluster also the head pod, whose state is on a
# volume: the recreated head resumes the cluster (a detached actor is reached with its state). Needs root, iproute2, Go >= 1.24, and the Python package
# with CPU JAX in PY's environment (scripts/python_env.sh, scripts/jax_venv.sh).
#   tests/kuberay_test.sh [PY (.venv-py/bin/python)]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "kuberay_test: skipped: pods need root and iproute2 for their namespaces"; exit 0
fi
py="${1:-.venv-py/bin/python}"
PY="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # a venv's python: keep the link
GO="$(command -v go || echo /usr/local/go/bin/go)"
[ -x "$GO" ] || { echo "kuberay_test: FAIL: no Go toolchain (go on PATH or /usr/local/go)"; exit 1; }
ray_compat="$("$PY" -c 'import sys; print(sys.prefix)')/lib/torus/ray-compat"
[ -x "$ray_compat/ray" ] || { echo "kuberay_test: FAIL: $ray_compat/ray not installed"; exit 1; }
bin="$PWD/build/kuberay-pods"
start=$(date +%s)
(cd tests/kuberay/operator && "$GO" build -mod=readonly -o "$bin" .)
echo "kuberay_test: operator program built in $(( $(date +%s) - start )) s"

run() {  # MANIFEST PROGRAM EXPECT COUNT [MORE FLAGS]
  python3 tests/kuberay/conformance.py --operator "$bin" --cluster "$1" --ray-compat "$ray_compat" \
    --python "$PY" --program "$2" --expect "$3" --expect-count "$4" --recreate "${@:5}"
}
# The CPU cluster's head keeps its state on a volume: its pod is also killed and recreated.
run examples/kuberay/cpu.yaml tests/kuberay/cpu_program.py "CPU CLUSTER OK" 1 \
  --head-program tests/kuberay/head_state_program.py
# After the recreate, the slice must be whole again: reserved, with a task on each of its hosts.
# (Not the JAX program again: a node hands a later job an idle worker of an earlier one, and a
# second jax.distributed.initialize in that process hangs; see docs/kuberay.md.)
run examples/kuberay/v6e-4x4-slice.yaml examples/python/tpu_slice_allreduce.py "(expected 136) OK" 4 \
  --program-after tests/kuberay/slice_whole_program.py --expect-after "SLICE WHOLE OK"
echo "kuberay_test: PASS"
