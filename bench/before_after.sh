#!/usr/bin/env bash
# Before/after on this machine: alternates two build directories (each a scripts/build.sh release
# tree, e.g. a copy of build/ made before a change) on the core microbenchmark (embedded default)
# and bench/gang_bench.sh, so both see the same machine state. Prints the JSON lines of each run,
# headed by "## <tool> <old|new> <round>".
#   bench/before_after.sh OLD_BUILD_DIR NEW_BUILD_DIR [MICRO_ROUNDS (3)] [GANG_ROUNDS (2)]
set -u
cd "$(dirname "$0")/.."
old=$(realpath "$1") new=$(realpath "$2") micro=${3:-3} gang=${4:-2}
ROWS=single_client_tasks_sync,single_client_tasks_async,1_1_actor_calls_sync,1_1_actor_calls_async,single_client_put_calls,single_client_get_calls,single_client_put_gigabytes
for round in $(seq "$micro"); do
  for which in old new; do
    B=$old; [ "$which" = new ] && B=$new
    echo "## microbench $which $round load $(cut -d' ' -f1 /proc/loadavg)"
    TORUS_TMPDIR=$(mktemp -d) LD_LIBRARY_PATH=$B "$B/bench/microbench" --rows "$ROWS" --seconds 2 2>&1 | grep '"name"'
  done
done
for round in $(seq "$gang"); do
  for which in old new; do
    B=$old; [ "$which" = new ] && B=$new
    echo "## gang_bench $which $round"
    TORUS_BUILD=$B bench/gang_bench.sh --iters 50 --sweep 1,64 --slices 4,64 2>&1 | grep '"name"'
  done
done
