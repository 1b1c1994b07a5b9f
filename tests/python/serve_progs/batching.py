"""Dynamic request batching (Ray Serve docs: "Dynamic Request Batching"): an async method
decorated with `@serve.batch(max_batch_size=4, batch_wait_timeout_s=0.1)` is called with one
argument per caller, receives a list of them, and returns a list of the same length whose i-th
element goes back to the i-th caller. Concurrent calls are grouped into batches of more than one
and never more than max_batch_size; a lone call still completes after the wait timeout; over
HTTP, concurrent requests are batched too."""
import os
import threading
import time
from typing import List

import ray
import requests
from ray import serve
from starlette.requests import Request

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(max_ongoing_requests=32)
class Batcher:
    def __init__(self):
        self.sizes = []

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.1)
    async def handle_batch(self, values: List[int]) -> List[dict]:
        assert isinstance(values, list), type(values)
        self.sizes.append(len(values))
        return [{"in": v, "out": v * 10, "batch": len(values)} for v in values]

    async def __call__(self, request_or_value):
        if isinstance(request_or_value, Request):
            value = int(request_or_value.query_params["v"])
        else:
            value = request_or_value
        return await self.handle_batch(value)

    def batch_sizes(self) -> List[int]:
        return list(self.sizes)

    def reset(self):
        self.sizes = []


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(Batcher.bind(), name="batch", route_prefix="/batch")

    # 8 calls at once through the handle.
    responses = [h.remote(i) for i in range(8)]
    results = [r.result(timeout_s=30) for r in responses]
    for i, res in enumerate(results):
        assert res["in"] == i and res["out"] == i * 10, (i, res)
    sizes = h.batch_sizes.remote().result(timeout_s=30)
    assert sum(sizes) == 8, sizes
    assert max(sizes) > 1, f"no call was batched: {sizes}"
    assert max(sizes) <= 4, f"a batch exceeded max_batch_size: {sizes}"
    assert max(r["batch"] for r in results) > 1, results

    # A lone call is not held forever: it runs as a batch of one after batch_wait_timeout_s.
    h.reset.remote().result(timeout_s=30)
    t0 = time.monotonic()
    assert h.remote(99).result(timeout_s=30)["out"] == 990
    assert time.monotonic() - t0 < 5, time.monotonic() - t0
    assert h.batch_sizes.remote().result(timeout_s=30) == [1]

    # Over HTTP, from 8 threads at once.
    h.reset.remote().result(timeout_s=30)
    out = [None] * 8
    barrier = threading.Barrier(8)

    def call(i):
        barrier.wait()
        r = requests.get(f"{BASE}/batch", params={"v": i}, timeout=30)
        out[i] = (r.status_code, r.json() if r.status_code == 200 else r.text)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, (code, body) in enumerate(out):
        assert code == 200 and body["in"] == i and body["out"] == i * 10, (i, code, body)
    sizes = h.batch_sizes.remote().result(timeout_s=30)
    assert sum(sizes) == 8 and max(sizes) <= 4, sizes
    assert max(sizes) > 1, f"no HTTP request was batched: {sizes}"

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
