"""Load shedding (Ray Serve docs: "Performance tuning" → max_ongoing_requests,
max_queued_requests; ray.serve.exceptions.BackPressureError "Raised when max_queued_requests is
exceeded on a DeploymentHandle"): with max_ongoing_requests=1 and max_queued_requests=1, of many
concurrent slow HTTP requests some are answered 200 and the rest are rejected with 503 at once
(not after the slow handler); through a DeploymentHandle the rejected calls raise BackPressureError;
once the burst is over, requests succeed again. Without max_queued_requests, calls beyond
max_ongoing_requests queue and all succeed, and a replica never runs more than
max_ongoing_requests at once."""
import os
import threading
import time

import ray
import requests
from ray import serve
from ray.serve.exceptions import BackPressureError

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"
SLOW_S = 1.5


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1)
class Narrow:
    async def __call__(self, request=None):
        import asyncio
        await asyncio.sleep(SLOW_S)
        return "done"


@serve.deployment(max_ongoing_requests=2)
class Capped:
    def __init__(self):
        self.current = 0
        self.peak = 0

    async def __call__(self, i: int):
        import asyncio
        self.current += 1
        self.peak = max(self.peak, self.current)
        try:
            await asyncio.sleep(0.3)
        finally:
            self.current -= 1
        return i

    def get_peak(self):
        return self.peak


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(Narrow.bind(), name="narrow", route_prefix="/narrow")

    n = 6
    results = [None] * n
    barrier = threading.Barrier(n)

    def call(i):
        barrier.wait()
        t0 = time.monotonic()
        r = requests.get(f"{BASE}/narrow", timeout=60)
        results[i] = (r.status_code, time.monotonic() - t0, r.text[:200])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    codes = sorted(r[0] for r in results)
    assert set(codes) <= {200, 503}, results
    assert codes.count(200) >= 1 and codes.count(503) >= 1, results
    # At most the one running and the one queued succeed.
    assert codes.count(200) <= 2, results
    for code, took, _ in results:
        if code == 503:
            assert took < SLOW_S, f"a rejection waited for the handler: {results}"

    time.sleep(0.5)
    r = requests.get(f"{BASE}/narrow", timeout=60)
    assert r.status_code == 200 and r.text == "done", (r.status_code, r.text)

    # Through the handle.
    responses = [h.remote() for _ in range(5)]
    ok, rejected = 0, 0
    for resp in responses:
        try:
            assert resp.result(timeout_s=60) == "done"
            ok += 1
        except BackPressureError as e:
            assert "max_queued_requests" in str(e) or "backpressure" in str(e).lower(), str(e)
            rejected += 1
    assert ok >= 1 and rejected >= 1 and ok <= 2, (ok, rejected)
    assert h.remote().result(timeout_s=60) == "done"

    # Without max_queued_requests, callers beyond max_ongoing_requests wait their turn: all
    # succeed, and the replica never runs more than max_ongoing_requests at once.
    c = serve.run(Capped.bind(), name="capped", route_prefix="/capped")
    responses = [c.remote(i) for i in range(8)]
    assert [r.result(timeout_s=60) for r in responses] == list(range(8))
    assert c.get_peak.remote().result(timeout_s=30) == 2

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
