#!/usr/bin/env bash
# The compiles scripts/test.sh runs in the background while its foreground tests run: the ASan
# and TSan builds and the clang thread-safety analysis, one after the other, on CPU time nothing
# else wants. Each job logs to DIR/<name>.log and appends "name<TAB>seconds<TAB>status<TAB>log"
# to DIR/done; DIR/pgid is this script's session and process group (to end it all).
#   setsid -w scripts/background_builds.sh DIR
# Every process runs under SCHED_IDLE (chrt --idle): a test process that wakes up takes the CPU
# from a compiler at once. Plain nice is not enough: with the kernel's autogroup scheduling (on by
# default, /proc/sys/kernel/sched_autogroup_enabled) nice only ranks a process within its
# session's group, and the daemons the tests start run in sessions of their own, so niced
# compilers still took half the CPU from a cluster under test (a 60 s test hit its 180 s
# timeout). Hence a session of its own, whose group is niced too (/proc/self/autogroup).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=$1
echo $$ > "$dir/pgid"
echo 19 > /proc/self/autogroup 2>/dev/null || true
idle=(chrt --idle 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
job() {  # NAME LOG COMMAND...
  local name=$1 log=$2 t0 rc=0
  shift 2
  t0=$(date +%s)
  "${idle[@]}" "$@" >"$log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" "$rc" "$log" >> "$dir/done"
}
job "build asan" "$dir/asan.log" scripts/build.sh asan
job "build tsan" "$dir/tsan.log" scripts/build.sh tsan
job "tsa (clang -Wthread-safety)" "$dir/tsa.log" scripts/tsa.sh build
