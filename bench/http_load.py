#!/usr/bin/env python3
"""A slice job's latency with and without 50 HTTP clients polling the head (docs/http.md).

Brings up the example v6e 4x4 manifest with one slice (`torus up`), then submits a gang job
(`true` on every host of the slice, through Ray's Jobs REST API) --runs times with no other
load and --runs times while 50 clients poll /api/jobs/ and /metrics as fast as they can;
prints the median and p90 submit-to-SUCCEEDED time of each and the pollers' request rate.
Usage: bench/http_load.py [--runs 20] [--torus build/torus]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def poll_forever(base, token):
    """50 threads polling the job list and /metrics until SIGTERM; prints polls/s and errors."""
    import signal
    stop, count, errors = threading.Event(), [0], [0]
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def poll(i):
        path = "/api/jobs/" if i % 2 else "/metrics"
        while not stop.is_set():
            try:
                req = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
                urllib.request.urlopen(req, timeout=60).read()
                count[0] += 1
            except Exception:  # noqa: BLE001
                errors[0] += 1
    t0 = time.perf_counter()
    threads = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(50)]
    for t in threads:
        t.start()
    while not stop.is_set():
        time.sleep(0.1)
    print(count[0] / (time.perf_counter() - t0), errors[0])


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--poll":
        return poll_forever(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--torus", default=str(REPO / "build" / "torus"))
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="torus-http-load-")
    env = dict(os.environ, TORUS_TMPDIR=root, TORUS_TPU_METADATA_URL="off")
    manifest = Path(root) / "v6e.yaml"
    manifest.write_text((REPO / "examples/clusters/v6e-4x4-3-slices.yaml").read_text()
                        .replace("replicas: 3", "replicas: 1").replace("maxReplicas: 3", "maxReplicas: 1"))
    subprocess.run([a.torus, "up", str(manifest), "--wait", "--port", "0"], env=env, check=True,
                   capture_output=True)
    try:
        session = Path(root, "session_latest").resolve()
        token = (session / "token").read_text().strip()
        base = "http://" + (session / "dashboard_address").read_text().strip()

        def call(method, path, body=None):
            req = urllib.request.Request(base + path, method=method, data=body,
                                         headers={"Authorization": "Bearer " + token})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read()) if path.startswith("/api") else r.read()

        def job_latency():
            t0 = time.perf_counter()
            sid = call("POST", "/api/jobs/", json.dumps({
                "entrypoint": "true", "metadata": {"torus.slice": "4x4", "torus.accelerator": "v6e"}
            }).encode())["submission_id"]
            while (d := call("GET", f"/api/jobs/{sid}"))["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
                time.sleep(0.005)
            # (as the client saw it, as the head recorded it: submission to end)
            return time.perf_counter() - t0, (d["end_time"] - d["start_time"]) / 1e3

        def series(n):
            runs = [job_latency() for _ in range(n)]
            client = sorted(r[0] for r in runs)
            head = sorted(r[1] for r in runs)
            return (statistics.median(client) * 1e3, client[int(0.9 * (n - 1))] * 1e3,
                    statistics.median(head) * 1e3, head[int(0.9 * (n - 1))] * 1e3)

        quiet = series(a.runs)
        # The pollers run in another process (50 threads), so that they do not share this
        # process's interpreter lock with the measurement.
        poller = subprocess.Popen([sys.executable, __file__, "--poll", base, token],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        loaded = series(a.runs)
        poller.terminate()
        rate, errors = poller.communicate(timeout=30)[0].split()
        rate, errors = float(rate), int(errors)
        print(f"slice job (v6e 4x4, 4 hosts) submit->SUCCEEDED over REST, {a.runs} runs each, "
              f"{os.cpu_count()} cores:")
        print(f"  quiet:      client median {quiet[0]:.0f} ms (p90 {quiet[1]:.0f}); "
              f"head-recorded median {quiet[2]:.0f} ms (p90 {quiet[3]:.0f})")
        print(f"  50 pollers: client median {loaded[0]:.0f} ms (p90 {loaded[1]:.0f}); "
              f"head-recorded median {loaded[2]:.0f} ms (p90 {loaded[3]:.0f}); "
              f"{rate:.0f} polls/s, {errors} errors")
        print(f"  ratio of medians: client {loaded[0] / quiet[0]:.1f}x, head-recorded "
              f"{loaded[2] / max(quiet[2], 1):.1f}x")
    finally:
        subprocess.run([a.torus, "down"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
