"""Streaming responses (Ray Serve docs: "Streaming Responses"): a starlette StreamingResponse
built from a generator is sent to the HTTP client chunk by chunk as the generator yields (the
first chunk arrives well before the last is produced), in order; through a handle,
`.options(stream=True)` on a generator method returns a DeploymentResponseGenerator that the
driver iterates synchronously, getting each yielded value in order; an async generator works
too, both over HTTP and through the handle."""
import asyncio
import os
import time

import ray
import requests
from ray import serve
from ray.serve.handle import DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import StreamingResponse

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"
N = 6
GAP_S = 0.4


@serve.deployment
class Streamer:
    def numbers(self, n: int):
        for i in range(n):
            yield i
            time.sleep(GAP_S)

    async def words(self, n: int):
        for i in range(n):
            yield f"w{i}"
            await asyncio.sleep(0.05)

    def __call__(self, request: Request) -> StreamingResponse:
        n = int(request.query_params.get("n", N))
        if request.url.path.endswith("/async"):
            async def agen():
                for i in range(n):
                    yield f"a{i}\n"
                    await asyncio.sleep(0.05)
            return StreamingResponse(agen(), media_type="text/plain")

        def gen():
            for i in range(n):
                yield f"chunk-{i}\n"
                time.sleep(GAP_S)
        return StreamingResponse(gen(), media_type="text/plain")


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(Streamer.bind(), name="stream", route_prefix="/stream")

    # HTTP: lines arrive one by one, in order, while the generator is still running.
    t0 = time.monotonic()
    arrivals, lines = [], []
    with requests.get(f"{BASE}/stream", stream=True, timeout=30) as r:
        assert r.status_code == 200, (r.status_code, r.text)
        assert r.headers["content-type"].startswith("text/plain"), r.headers
        assert "content-length" not in {k.lower() for k in r.headers}, r.headers
        for line in r.iter_lines(chunk_size=None, decode_unicode=True):
            if line:
                lines.append(line)
                arrivals.append(time.monotonic() - t0)
    assert lines == [f"chunk-{i}" for i in range(N)], lines
    # The generator sleeps GAP_S after each chunk: (N-1)*GAP_S = 2 s from first to last.
    spread = arrivals[-1] - arrivals[0]
    assert spread > (N - 1) * GAP_S * 0.6, f"the chunks were not streamed: {arrivals}"

    r = requests.get(f"{BASE}/stream/async", params={"n": 5}, timeout=30)
    assert r.status_code == 200 and r.text == "".join(f"a{i}\n" for i in range(5)), r.text

    # Handle: a DeploymentResponseGenerator iterated synchronously in the driver.
    gen = h.options(method_name="numbers", stream=True).remote(N)
    assert isinstance(gen, DeploymentResponseGenerator), type(gen)
    t0 = time.monotonic()
    got, times = [], []
    for value in gen:
        got.append(value)
        times.append(time.monotonic() - t0)
    assert got == list(range(N)), got
    assert times[-1] - times[0] > (N - 1) * GAP_S * 0.6, f"not streamed: {times}"

    # An async generator method, through the attribute form of the handle.
    words = list(h.options(stream=True).words.remote(4))
    assert words == ["w0", "w1", "w2", "w3"], words

    # Calling a generator method without stream=True is an error.
    try:
        h.numbers.remote(2).result(timeout_s=30)
    except Exception:
        pass
    else:
        raise AssertionError("a generator method answered a non-streaming call")

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
