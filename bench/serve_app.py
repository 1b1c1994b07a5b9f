"""One round of the Serve benchmark, as a plain Ray program (bench/serve_bench.py runs it on Ray
with Ray's interpreter and on Torus with `python -m torus.ray`). Prints one JSON line of figures.

Phases: `ray.init`; `serve.run` (Serve not started before) to the first HTTP answer, from
`serve.run` and from `ray.init`; HTTP no-op load with
wrk at 1 and 2 replicas (requests/s, p50, p99); handle calls from the driver (sequential and
100 in flight); the time from SIGKILL of the only replica to the first answer from its
replacement; and the time from the start of a load that needs a second replica to that replica
running (autoscaling); last, `serve.run` to the first answer again, 2 s after `serve.shutdown`.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import ray
from ray import serve

PORT = 8000
SECONDS = float(os.environ.get("SERVE_BENCH_SECONDS", "10"))
CONNS = int(os.environ.get("SERVE_BENCH_CONNECTIONS", "16"))
URL = f"http://127.0.0.1:{PORT}/"


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100)
class Noop:
    def __call__(self, request):
        return "ok"

    def pid(self):
        return os.getpid()

    def nothing(self):
        return None


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1,
                  autoscaling_config={"min_replicas": 1, "max_replicas": 2,
                                      "target_ongoing_requests": 1, "upscale_delay_s": 0,
                                      "downscale_delay_s": 600, "metrics_interval_s": 0.1,
                                      "look_back_period_s": 0.5})
class Slow:
    def __call__(self, request):
        time.sleep(0.2)
        return "slow"


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def first_answer():
    while True:
        try:
            if http_get(URL)[0] == 200:
                return
        except OSError:
            time.sleep(0.001)


def wrk(url):
    out = subprocess.run(["wrk", "-t1", f"-c{CONNS}", f"-d{SECONDS:.0f}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout

    def ms(label):
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": ms("50"), "p99_ms": ms("99"),
            "non2xx": int(errors.group(1)) if errors else 0}


def main():
    res = {}
    t_init = time.perf_counter()
    ray.init()
    t0 = time.perf_counter()
    res["init_s"] = t0 - t_init
    serve.run(Noop.bind(), name="noop", route_prefix="/")
    first_answer()
    res["run_to_first_answer_s"] = time.perf_counter() - t0
    res["init_and_run_to_first_answer_s"] = time.perf_counter() - t_init
    http_get(URL)
    res["http_1"] = wrk(URL)
    serve.run(Noop.options(num_replicas=2).bind(), name="noop", route_prefix="/")
    res["http_2"] = wrk(URL)
    serve.run(Noop.bind(), name="noop", route_prefix="/")
    h = serve.get_app_handle("noop")
    for _ in range(50):
        h.nothing.remote().result()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < SECONDS / 2:
        h.nothing.remote().result()
        n += 1
    res["handle_seq_per_s"] = n / (time.perf_counter() - t)
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < SECONDS / 2:
        for r in [h.nothing.remote() for _ in range(100)]:
            r.result()
        n += 100
    res["handle_100_inflight_per_s"] = n / (time.perf_counter() - t)
    # Replacement of a killed replica.
    pid = h.pid.remote().result()
    t = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    while True:
        try:
            if h.pid.remote().result(timeout_s=2) != pid:
                break
        except Exception:
            time.sleep(0.005)
    res["replace_killed_s"] = time.perf_counter() - t
    # Autoscaling: 3 clients in a loop need a second replica.
    serve.run(Slow.bind(), name="slow", route_prefix="/slow")
    http_get(f"http://127.0.0.1:{PORT}/slow")
    stop = threading.Event()

    def client():
        while not stop.is_set():
            try:
                http_get(f"http://127.0.0.1:{PORT}/slow", timeout=10)
            except OSError:
                pass

    threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    while True:
        st = serve.status().applications["slow"].deployments["Slow"]
        running = sum(v for k, v in st.replica_states.items() if str(getattr(k, "value", k))
                      == "RUNNING")
        if running >= 2:
            break
        if time.perf_counter() - t > 120:
            running = -1
            break
        time.sleep(0.01)
    res["autoscale_up_s"] = time.perf_counter() - t if running >= 2 else None
    stop.set()
    for th in threads:
        th.join()
    # Serve started again in the same program, on a cluster that has settled.
    serve.shutdown()
    time.sleep(2)
    t = time.perf_counter()
    serve.run(Noop.bind(), name="noop", route_prefix="/")
    first_answer()
    res["rerun_to_first_answer_s"] = time.perf_counter() - t
    serve.shutdown()
    ray.shutdown()
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())
