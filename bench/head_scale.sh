#!/usr/bin/env bash
# The head at 1k to 50k simulated TPU hosts over the real protocol (bench/head_scale.cc):
# a fresh `torus head` process per size, every node heartbeating at --heartbeat-ms.
# Usage: bench/head_scale.sh [--nodes 1000,2000,5000,10000] [--heartbeat-ms 1000]
#                            [--warmup-s 20] [--measure-s 20] [--cycles 50] [--kill 200] [-- HEAD FLAGS]
# (--kill K: K hosts killed at the end, half of them silently, to time their detection)
# Writes bench/results/head_scale-<UTC time>.csv and prints a table (after scripts/build.sh release).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=1000,2000,5000,10000
hb=1000; warmup=20; measure=20; cycles=50; kill=200
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) sizes="$2"; shift 2 ;;
    --heartbeat-ms) hb="$2"; shift 2 ;;
    --warmup-s) warmup="$2"; shift 2 ;;
    --measure-s) measure="$2"; shift 2 ;;
    --cycles) cycles="$2"; shift 2 ;;
    --kill) kill="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
export TORUS_TMPDIR="${TORUS_TMPDIR:-$(mktemp -d /tmp/torus-scale.XXXXXX)}"
mkdir -p bench/results
csv="bench/results/head_scale-$(date -u +%Y%m%dT%H%M%SZ).csv"
echo "# machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# heartbeat every ${hb} ms per node, warm-up ${warmup} s, measured ${measure} s, ${cycles} slice cycles"
for n in ${sizes//,/ }; do
  build/bench/head_scale --torus build/torus --nodes "$n" --heartbeat-ms "$hb" --warmup-s "$warmup" \
    --measure-s "$measure" --cycles "$cycles" --kill "$kill" --csv "$csv" -- "$@" >/dev/null
done
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cols = [("nodes", "nodes", "{:.0f}"), ("paced_heartbeat_ms", "period ms", "{:.0f}"),
        ("register_s", "register s", "{:.1f}"), ("heartbeats_per_s", "hb/s", "{:.0f}"),
        ("head_cpu_pct", "head CPU %", "{:.1f}"), ("heartbeat_p99_ms", "hb p99 ms", "{:.1f}"),
        ("view_records_per_s", "view rec/s", "{:.0f}"), ("view_kb_per_s", "view KiB/s", "{:.0f}"),
        ("rss_bytes_per_node", "RSS B/node", "{:.0f}"), ("pss_bytes_per_node", "PSS B/node", "{:.0f}"),
        ("false_deaths", "false deaths", "{:.0f}"), ("slice_decision_us_p50", "slice dec us p50", "{:.1f}"),
        ("slice_decision_us_p90", "p90", "{:.1f}"), ("slice_decision_us_p99", "p99", "{:.1f}"),
        ("slice_reserve_ms_p50", "slice rtt ms", "{:.2f}"),
        ("loadavg1", "load", "{:.1f}")]
for v, h in [("pack4", "PACK4"), ("spread4", "SPREAD4"), ("strict_pack4", "S_PACK4"),
             ("strict_spread4", "S_SPREAD4"), ("spread4_label", "SPREAD4 label"),
             ("spread4_custom", "SPREAD4 custom")]:
    cols += [(f"pg_{v}_decision_us_p50", f"{h} dec us p50", "{:.1f}"), (f"pg_{v}_decision_us_p99", "p99", "{:.1f}")]
cols += [("killed", "killed", "{:.0f}"), ("undetected", "undetected", "{:.0f}"),
         ("false_dead_in_view", "false dead in view", "{:.0f}"), ("detect_s_p50", "dead after s p50", "{:.2f}"),
         ("detect_s_p99", "p99", "{:.2f}"), ("detect_s_max", "max", "{:.2f}"),
         ("detect_closed_s_p50", "process killed p50", "{:.2f}"), ("detect_closed_s_p99", "p99", "{:.2f}"),
         ("detect_silent_s_p50", "host vanished p50", "{:.2f}"), ("detect_silent_s_p99", "p99", "{:.2f}")]
print(" | ".join(h for _, h, _ in cols))
for r in rows:
    print(" | ".join(f.format(float(r[k])) if k in r else "-" for k, _, f in cols))
# Memory per node beyond a fixed base: the growth of the head's resident memory between two
# cluster sizes, per added node (RSS and PSS), which cancels whatever the head holds at any size.
for a, b in zip(rows, rows[1:]):
    dn = float(b["nodes"]) - float(a["nodes"])
    if dn <= 0:
        continue
    rss = (float(b["rss_kb"]) - float(a["rss_kb"])) * 1024 / dn
    pss = (float(b["pss_kb"]) - float(a["pss_kb"])) * 1024 / dn
    print(f"# growth {a['nodes']} -> {b['nodes']} nodes: {rss:.0f} B RSS, {pss:.0f} B PSS per added node")
print("# csv:", sys.argv[1])
PY
