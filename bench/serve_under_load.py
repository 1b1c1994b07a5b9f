"""Serve under load, as a plain Ray program (run it with Ray's interpreter, or on Torus with
`python -m torus.ray bench/serve_under_load.py`): 8 client threads send HTTP requests for
SERVE_LOAD_SECONDS (default 12) to a deployment of 2 replicas whose handler takes 20 ms; at 1/4
of the run `serve.run` rolls out a new version; at 2/3 one replica is SIGKILLed. Prints one JSON
line: requests answered and failed in each phase, failures' status codes, and p50/p99 latency.
"""
import json
import os
import signal
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

import ray
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
SECONDS = float(os.environ.get("SERVE_LOAD_SECONDS", "12"))


def make(version):
    @serve.deployment(name="Work", num_replicas=2, max_ongoing_requests=8,
                      ray_actor_options={"num_cpus": 0})
    class Work:
        def __call__(self, request):
            time.sleep(0.02)
            return f"{version} {os.getpid()}"
    return Work.bind()


def main():
    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(make("v1"), name="load", route_prefix="/")
    url = f"http://127.0.0.1:{PORT}/"
    events = []  # (t, ok, status, latency, body)
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.monotonic()

    def client():
        while not stop.is_set():
            s = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    body, status, ok = r.read().decode(), r.status, True
            except urllib.error.HTTPError as e:
                body, status, ok = e.read().decode()[:100], e.code, False
            except OSError as e:
                body, status, ok = repr(e)[:100], 0, False
            with lock:
                events.append((s - t0, ok, status, time.monotonic() - s, body))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(SECONDS / 4)
    roll_at = time.monotonic() - t0
    serve.run(make("v2"), name="load", route_prefix="/")
    rolled_at = time.monotonic() - t0
    time.sleep(max(0.0, SECONDS * 2 / 3 - (time.monotonic() - t0)))
    with lock:
        v2 = [e[4] for e in events[-50:] if e[1] and e[4].startswith("v2")]
    victim = int(v2[-1].split()[1])
    kill_at = time.monotonic() - t0
    os.kill(victim, signal.SIGKILL)
    time.sleep(max(0.0, SECONDS - (time.monotonic() - t0)))
    stop.set()
    for t in threads:
        t.join()

    def phase(lo, hi):
        es = [e for e in events if lo <= e[0] < hi]
        lat = sorted(e[3] * 1000 for e in es if e[1])
        return {"answered": sum(1 for e in es if e[1]), "failed": sum(1 for e in es if not e[1]),
                "failure_statuses": sorted({e[2] for e in es if not e[1]}),
                "p50_ms": round(statistics.median(lat), 2) if lat else None,
                "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2) if lat else None}

    out = {"rollout_started_s": round(roll_at, 2), "rollout_done_s": round(rolled_at, 2),
           "kill_at_s": round(kill_at, 2),
           "before_rollout": phase(0, roll_at), "during_rollout": phase(roll_at, rolled_at),
           "after_rollout_before_kill": phase(rolled_at, kill_at),
           "after_kill": phase(kill_at, 1e9),
           "first_v2_answer_s": round(min((e[0] for e in events
                                           if e[1] and e[4].startswith("v2")), default=-1), 2),
           "last_v1_answer_s": round(max((e[0] for e in events
                                          if e[1] and e[4].startswith("v1")), default=-1), 2)}
    serve.shutdown()
    ray.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
