"""Request-based autoscaling (Ray Serve docs: "Ray Serve Autoscaling", "Advanced Ray Serve
Autoscaling"): with autoscaling_config min_replicas=1, max_replicas=3, target_ongoing_requests=1
and short delays, sustained concurrent slow requests grow the deployment to max_replicas (seen in
serve.status() replica_states and as distinct replica processes answering), never beyond; once
the load stops it shrinks back to min_replicas; no request fails meanwhile."""
import os
import threading
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"

AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 3,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0.5,
    "downscale_delay_s": 2,
    "metrics_interval_s": 0.5,
    "look_back_period_s": 1,
}


@serve.deployment(autoscaling_config=AUTOSCALING, max_ongoing_requests=5,
                  graceful_shutdown_timeout_s=5, graceful_shutdown_wait_loop_s=0.5)
class Slow:
    async def __call__(self, request=None):
        import asyncio
        await asyncio.sleep(0.5)
        return str(os.getpid())


def running_replicas() -> int:
    dep = serve.status().applications["auto"].deployments["Slow"]
    return dep.replica_states.get("RUNNING", 0)


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Slow.bind(), name="auto", route_prefix="/auto")
    assert running_replicas() == 1, serve.status()

    stop = threading.Event()
    pids, failures, lock = set(), [], threading.Lock()

    def load():
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    r = s.get(f"{BASE}/auto", timeout=30)
                    with lock:
                        if r.status_code == 200:
                            pids.add(r.text)
                        else:
                            failures.append((r.status_code, r.text[:200]))
                except requests.RequestException as e:
                    with lock:
                        failures.append(repr(e))

    threads = [threading.Thread(target=load, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    peak = 1
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            n = running_replicas()
            peak = max(peak, n)
            assert n <= 3, f"more than max_replicas: {serve.status()}"
            with lock:
                seen = len(pids)
            if n == 3 and seen == 3:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"did not scale to 3 replicas under load: peak {peak}, "
                                 f"{len(pids)} pids answered; {serve.status()}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not failures, failures[:5]
    assert len(pids) == 3, pids

    # Load gone: back to min_replicas.
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        dep = serve.status().applications["auto"].deployments["Slow"]
        if dict(dep.replica_states) == {"RUNNING": 1}:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"did not scale back to 1 replica: {serve.status()}")
    for _ in range(3):
        r = requests.get(f"{BASE}/auto", timeout=30)
        assert r.status_code == 200 and r.text in pids, (r.status_code, r.text, pids)

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
