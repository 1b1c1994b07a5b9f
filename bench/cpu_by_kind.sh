#!/usr/bin/env bash
# CPU use of a running local cluster over a window, summed by kind of process (torus head,
# torus node, benchmark drivers, other torus processes such as workers), from /proc/<pid>/stat
# (utime + stime, in clock ticks of 10 ms: 100% = one core), and how busy the whole machine was.
# Usage: bench/cpu_by_kind.sh SECONDS
set -u
secs="${1:-5}"
declare -A before
for p in $(pgrep -f "torus|gang_bench|microbench"); do
  before[$p]=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null)
done
read -r _ u n s i w x y _ < /proc/stat; busy0=$((u + n + s + x + y)); idle0=$((i + w))
sleep "$secs"
read -r _ u n s i w x y _ < /proc/stat; busy1=$((u + n + s + x + y)); idle1=$((i + w))
for p in "${!before[@]}"; do
  now=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null) || continue
  [ -z "$now" ] && continue
  cmd=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)
  kind=other
  case "$cmd" in *"torus head"*) kind=head ;; *"torus node"*) kind=node ;; *gang_bench*|*microbench*) kind=bench ;; esac
  echo "$kind $((now - ${before[$p]}))"
done | awk -v s="$secs" '{t[$1] += $2; n[$1]++} END {for (k in t) printf "%s %d%% of a core (%d processes)\n", k, t[k] / s, n[k]}'
echo "machine busy: $(( (busy1 - busy0) * 100 / ((busy1 - busy0) + (idle1 - idle0)) ))% of all cores"
