#!/usr/bin/env bash
# The JAX example on a simulated slice whose hosts each have their own network namespace
# (`torus up --netns`): 4 processes, one per host of a reserved v6e 4x4 slice, joined by
# jax.distributed over the namespaces' own addresses; the all-reduce must give the exact value.
# Usage: jax_netns_test.sh TORUS_BINARY SOURCE_DIR   (skipped, exit 77, when not root)
set -euo pipefail
T="$1"; SRC="$2"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "SKIP: needs root and iproute2 for network namespaces"; exit 77
fi
PY=$("$SRC/scripts/jax_venv.sh")
export TORUS_TMPDIR="$(mktemp -d /tmp/torus-jaxns.XXXXXX)"
export TORUS_TPU_METADATA_URL=off
trap '"$T" down >/dev/null 2>&1 || true; rm -rf "$TORUS_TMPDIR"' EXIT
"$T" up --netns "$SRC/examples/clusters/v6e-4x4-3-slices.yaml" --wait >/dev/null
out=$("$T" job submit --slice 4x4 --accelerator v6e -- \
        env DEVICES_PER_PROCESS=2 "$PY" "$SRC/examples/jax_allreduce/allreduce.py" 2>&1) || {
  echo "$out"; echo "FAIL: the gang job failed"; exit 1; }
echo "$out"
ok=$(grep -c "psum over 8 devices = 36 (expected 36) OK" <<<"$out" || true)
hosts=$(grep -o "on tpu-v6e-[0-9]*/[0-3]" <<<"$out" | sort -u | wc -l)
[ "$ok" = 4 ] || { echo "FAIL: $ok of 4 processes report the right all-reduce"; exit 1; }
[ "$hosts" = 4 ] || { echo "FAIL: processes ran on $hosts distinct hosts, not 4"; exit 1; }
echo "PASS: all-reduce over 4 hosts in 4 network namespaces"
