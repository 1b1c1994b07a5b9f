#!/usr/bin/env bash
# Gang-reservation benchmarks on clusters of real node processes on this machine:
#  1. placement-group creation latency against bundle count (1, 4, 16, 64) on 64 nodes, and
#     the floor of its one round to the nodes (bench/fanout_floor: a no-op call to all 64 at once),
#     and that round with the nodes' real reservation work (fanout_prepare_64_nodes);
#  2. whole-slice reserve+release latency for v6e slices of 1, 4, 16 and 64 hosts
#     (2x4, 4x4, 8x8, 16x16), every host a node process with GKE's TPU environment.
# Usage: bench/gang_bench.sh [--iters N] [--sweep LIST|none] [--slices LIST|none]
#   (after scripts/build.sh release). --sweep: bundle counts of part 1 (default 1,4,16,64);
#   --slices: slice sizes in hosts of part 2, from 1,4,16,64 (default all). TORUS_BUILD=DIR runs
#   the binaries of another build directory (default build), e.g. a baseline for side-by-side runs.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=100
sweep=1,4,16,64
slices=1,4,16,64
while [ $# -gt 0 ]; do
  case "$1" in
    --iters) iters="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --slices) slices="$2"; shift 2 ;;
    *) echo "usage: $0 [--iters N] [--sweep LIST|none] [--slices LIST|none]" >&2; exit 2 ;;
  esac
done
BUILD="${TORUS_BUILD:-build}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac  # relative to the repo, or absolute
# The binaries' RUNPATH names build/: load the chosen build's libtorus (nodes inherit this).
export LD_LIBRARY_PATH="$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T=$BUILD/torus
B=$BUILD/bench/gang_bench
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-gang.XXXXXX)}"
export TORUS_TPU_METADATA_URL=off
trap '$T stop >/dev/null 2>&1 || true' EXIT

start_head() {
  port=$(( 20000 + RANDOM % 20000 ))
  $T start --head --port "$port" --num-cpus 1 ${TORUS_HEAD_FLAGS:-} >/dev/null
  export TORUS_ADDRESS="127.0.0.1:$port"
}
count_nodes() {
  $T list nodes --format json | python3 -c 'import json,sys; print(sum(n["state"] == "ALIVE" for n in json.load(sys.stdin)))'
}
wait_nodes() {  # wait until the head lists $1 alive nodes
  for _ in $(seq 300); do
    n=$(count_nodes)
    [ "$n" -ge "$1" ] && return 0
    sleep 0.2
  done
  echo "only $n of $1 nodes registered" >&2; return 1
}
# add_slice NAME ACCEL_TYPE TOPOLOGY HOSTS
add_slice() {
  local hosts="" j
  for j in $(seq 0 $(( $4 - 1 ))); do hosts+="${hosts:+,}$1-$j"; done
  for j in $(seq 0 $(( $4 - 1 ))); do
    for _try in 1 2 3; do  # a start can time out on a loaded machine: try again
      TPU_NAME="$1" TPU_WORKER_ID="$j" TPU_ACCELERATOR_TYPE="$2" TPU_TOPOLOGY="$3" \
      TPU_WORKER_HOSTNAMES="$hosts" TORUS_TPU_CHIPS=$([ "$4" = 1 ] && echo 8 || echo 4) \
        $T start --address "$TORUS_ADDRESS" --num-cpus 1 >/dev/null 2>&1 && break
    done &
    (( (j + 1) % 4 == 0 )) && { wait || true; }  # a few at a time: 2 cores
  done
  wait || true
}

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# build: $BUILD"
if [ "$sweep" != none ]; then
echo "# 1. placement-group creation latency against bundle count, 64 node processes"
start_head
for i in $(seq 63); do
  $T start --address "$TORUS_ADDRESS" --num-cpus 1 >/dev/null 2>&1 &
  (( i % 4 == 0 )) && { wait || true; }  # a few at a time: 2 cores
done
wait || true
# A start that timed out on the loaded machine: add plain nodes until there are 64.
for _ in $(seq 20); do
  [ "$(count_nodes)" -ge 64 ] && break
  $T start --address "$TORUS_ADDRESS" --num-cpus 1 >/dev/null || true
done
wait_nodes 64
$B --sweep "$sweep" --iters "$iters"
# The floor of a creation's one round to the nodes, on the same 64 node processes; and the
# same round doing the nodes' real reservation work, from a process other than the head.
"$BUILD/bench/fanout_floor" --rounds 1 --iters "$iters" --prepare 1
echo "# node daemon resident memory at idle (kB, VmRSS of each 'torus node' process): median"
for p in $(pgrep -f "torus node" || true); do awk '/VmRSS/{print $2}' /proc/$p/status; done | sort -n |
  awk '{a[NR]=$1} END{if (NR) print "{\"name\": \"node_idle_rss_kb\", \"median\": " a[int((NR+1)/2)] ", \"max\": " a[NR] ", \"n\": " NR "}"}'
$T stop >/dev/null
fi

[ "$slices" = none ] && exit 0
echo "# 2. slice reserve+release latency against slice size"
start_head
want=1  # the head's own node
topos=()
for h in ${slices//,/ }; do
  case "$h" in
    1) add_slice s1 v6e-8 2x4 1; topos+=(2x4) ;;
    4) add_slice s4 v6e-16 4x4 4; topos+=(4x4) ;;
    16) add_slice s16 v6e-64 8x8 16; topos+=(8x8) ;;
    64) add_slice s64 v6e-256 16x16 64; topos+=(16x16) ;;
    *) echo "slice sizes are 1, 4, 16 or 64 hosts, not $h" >&2; exit 2 ;;
  esac
  want=$(( want + h ))
done
wait_nodes "$want"
echo "# load before the slice runs: $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${topos[@]}"; do $B --slice "$t" --accelerator v6e --iters "$iters"; done
$T stop >/dev/null
