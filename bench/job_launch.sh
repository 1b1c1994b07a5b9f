#!/usr/bin/env bash
# Gang-launch latency: time from `torus job submit --slice 4x4 --accelerator v6e -- true` (the
# client's start) until the last of the 4 processes was started by its node (the nodes'
# started_ms), on the simulated cluster of scripts/main_job.sh. Prints each run and the
# median. Needs build/torus.   bench/job_launch.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
export TORUS_TMPDIR="$(mktemp -d /tmp/torus-bench-jobs.XXXXXX)"
export TORUS_TPU_METADATA_URL=off
T=build/torus
eval "$(sed -n '/^cluster_up()/,/^cluster_down()/p' scripts/main_job.sh)"
trap cluster_down EXIT
cluster_up
vals=()
for i in $(seq "$runs"); do
  t0=$(date +%s%3N)
  id=$($T job submit --no-wait --slice 4x4 --accelerator v6e -- true)
  while ! $T job status "$id" | grep -qE "SUCCEEDED|FAILED|STOPPED"; do sleep 0.1; done
  json=$($T job status "$id" --format json)
  last=$(python3 -c 'import json,sys; j=json.load(sys.stdin); print(max(int(p["started_ms"]) for p in j["processes"]))' <<<"$json")
  sub=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["submitted_ms"])' <<<"$json")
  echo "run $i: $id  submit->all 4 started: $((last - t0)) ms (head accepted at +$((sub - t0)) ms)"
  vals+=($((last - t0)))
done
printf '%s\n' "${vals[@]}" | sort -n | awk '{a[NR]=$1} END {print "median submit->all started: " a[int((NR+1)/2)] " ms over " NR " runs"}'
