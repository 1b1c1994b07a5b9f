"""A replica dying under load (Ray Serve docs: "Add End-to-End Fault Tolerance" → replica
failures): with two replicas (max_ongoing_requests=2) each holding two slow HTTP requests, one
replica's process is SIGKILLed. Exactly the two requests it held fail, each with an HTTP 5xx; the
two held by the other replica succeed; requests sent right after the kill are not lost to the
dead replica (the router moves them to the live one); the deployment gets a new second replica
and then every request succeeds, from both replicas."""
import os
import signal
import tempfile
import threading
import time

import ray
import requests
from ray import serve
from starlette.requests import Request

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"
SLOW_S = 4.0


@serve.deployment(num_replicas=2, max_ongoing_requests=2, health_check_period_s=1)
class Holder:
    def __init__(self, marker_dir: str):
        self.marker_dir = marker_dir

    async def __call__(self, request: Request):
        import asyncio
        if request.query_params.get("slow"):
            tag = request.query_params["slow"]
            # Tell the driver which process holds this request.
            with open(os.path.join(self.marker_dir, f"{os.getpid()}-{tag}"), "w"):
                pass
            await asyncio.sleep(SLOW_S)
        return str(os.getpid())


def main():
    marker_dir = tempfile.mkdtemp(prefix="serve-kill-")
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Holder.bind(marker_dir), name="hold", route_prefix="/hold")

    results = {}

    def call(i):
        try:
            r = requests.get(f"{BASE}/hold", params={"slow": str(i)}, timeout=60)
            results[i] = (r.status_code, r.text[:300])
        except requests.RequestException as e:
            results[i] = (None, repr(e))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # Wait until all four are running: two in each replica.
    deadline = time.monotonic() + 30
    holders = {}
    while time.monotonic() < deadline:
        holders = {}
        for name in os.listdir(marker_dir):
            pid, tag = name.split("-")
            holders.setdefault(int(pid), set()).add(tag)
        if sum(len(v) for v in holders.values()) == 4:
            break
        time.sleep(0.05)
    assert sorted(len(v) for v in holders.values()) == [2, 2], holders
    victim, survivor = sorted(holders)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()

    # Right after the kill, new requests go to the live replica.
    after_kill = []
    with requests.Session() as s:
        for _ in range(5):
            r = s.get(f"{BASE}/hold", timeout=60)
            after_kill.append((r.status_code, r.text))
    for t in threads:
        t.join(60)
    assert time.monotonic() - killed_at < SLOW_S + 30

    print("held by the killed replica:", sorted(holders[victim]), "results:", results)
    for i in range(4):
        code, body = results[i]
        if str(i) in holders[victim]:
            assert code is not None and 500 <= code < 600, \
                f"request {i} held by the killed replica: {code} {body}"
        else:
            assert code == 200 and body == str(survivor), \
                f"request {i} held by the live replica: {code} {body}"
    assert all(code == 200 for code, _ in after_kill), after_kill

    # A replacement comes up; then everything succeeds, from two replicas again.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dep = serve.status().applications["hold"].deployments["Holder"]
        if dep.status == "HEALTHY" and dict(dep.replica_states) == {"RUNNING": 2}:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no replacement replica: {serve.status()}")
    pids = set()
    with requests.Session() as s:
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            r = s.get(f"{BASE}/hold", timeout=30)
            assert r.status_code == 200, (r.status_code, r.text)
            pids.add(int(r.text))
    assert len(pids) == 2 and victim not in pids and survivor in pids, (pids, victim, survivor)

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
