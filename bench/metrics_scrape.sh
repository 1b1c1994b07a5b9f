#!/usr/bin/env bash
# What the HTTP surface costs (docs/metrics.md "Cost"):
#  1. /metrics render time on a head with N simulated hosts (bench/head_scale.cc's nodes,
#     heartbeating): median and p90 of --scrapes scrapes, and the size of the text; the same
#     for the dashboard's nodes page, overview and slices;
#  2. head and node CPU at idle over --idle-s seconds, first without any scraper, then with a
#     Prometheus server scraping both every second (a `torus start` cluster of one node).
# Usage: bench/metrics_scrape.sh [--nodes 10000] [--scrapes 20] [--idle-s 30]
# Needs a release build (scripts/build.sh release) and Debian's prometheus.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=10000; scrapes=20; idle=30
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --scrapes) scrapes="$2"; shift 2 ;;
    --idle-s) idle="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/torus-metrics-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; build/torus stop >/dev/null 2>&1 || true' EXIT
export TORUS_TMPDIR=$work/root
mkdir -p "$TORUS_TMPDIR"
echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. render time at $nodes hosts
build/bench/head_scale --torus build/torus --nodes "$nodes" --heartbeat-ms 1000 --warmup-s 60 \
  --measure-s 120 --cycles 5 --csv "$work/scale.csv" -- --dashboard-port 0 > "$work/scale.out" 2>&1 &
for _ in $(seq 600); do
  d=$(cat "$TORUS_TMPDIR"/session_*/dashboard_address 2>/dev/null || true)
  [ -n "$d" ] && break
  sleep 0.1
done
session=$(dirname "$(ls "$TORUS_TMPDIR"/session_*/dashboard_address)")
token=$(cat "$session/token")
# until every host is in the head's table
for _ in $(seq 600); do
  alive=$(curl -s -H "Authorization: Bearer $token" "http://$d/metrics" | awk '/^torus_nodes\{state="alive"\}/{print $2}')
  [ "${alive:-0}" -ge "$nodes" ] && break
  sleep 0.5
done
python3 - "$d" "$token" "$scrapes" "$nodes" <<'PY'
import statistics, sys, time, urllib.request
addr, token, n, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
# /metrics, and what one dashboard refresh reads (the nodes page, the overview, the slices)
for path in ("/metrics", "/api/dashboard/nodes?limit=50&offset=5000", "/api/dashboard/overview",
             "/api/dashboard/slices"):
    times, size = [], 0
    for _ in range(n):
        req = urllib.request.Request(f"http://{addr}{path}", headers={"Authorization": "Bearer " + token})
        t0 = time.perf_counter()
        body = urllib.request.urlopen(req, timeout=60).read()
        times.append(time.perf_counter() - t0)
        size = len(body)
        time.sleep(0.5)
    times.sort()
    print(f"{path}: {nodes} hosts, {size / 1e6:.2f} MB, median {statistics.median(times) * 1e3:.0f} ms,"
          f" p90 {times[int(0.9 * (len(times) - 1))] * 1e3:.0f} ms over {n} requests")
PY
kill %1 2>/dev/null || true
wait 2>/dev/null || true

# 2. idle CPU of a one-node cluster, without and with a 1 s Prometheus scrape
out=$(build/torus start --head --port 0 --dashboard-port 0 --dashboard-agent-listen-port 0 --num-cpus 2)
session=$(readlink -f "$TORUS_TMPDIR/session_latest")
token=$(cat "$session/token")
head_pid=$(awk "{print \$1}" "$session/pids/head.pid")
node_pid=$(awk "{print \$1}" "$session/pids/node-head.pid")
agent=$(grep -ho 'node agent listening on http://[0-9.:]*' "$session"/logs/*.err | tail -1 | sed 's|.*http://||')
cpu() {  # utime+stime of pid $1 in clock ticks
  awk '{print $14 + $15}' "/proc/$1/stat"
}
measure() {
  local h0 n0 h1 n1 hz
  hz=$(getconf CLK_TCK)
  h0=$(cpu "$head_pid"); n0=$(cpu "$node_pid")
  sleep "$idle"
  h1=$(cpu "$head_pid"); n1=$(cpu "$node_pid")
  python3 -c "print(f'$1: head {100*($h1-$h0)/$hz/$idle:.2f} % CPU, node {100*($n1-$n0)/$hz/$idle:.2f} % CPU over $idle s')"
}
sleep 3
measure "idle, no scraper"
echo "$token" > "$work/token"
cat > "$work/prometheus.yml" <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: torus
    authorization: {type: Bearer, credentials_file: $work/token}
    static_configs: [{targets: ["$(cat "$session/dashboard_address")", "$agent"]}]
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address=127.0.0.1:0 > "$work/prometheus.log" 2>&1 &
sleep 3
measure "idle, Prometheus scraping head and node every 1 s"
