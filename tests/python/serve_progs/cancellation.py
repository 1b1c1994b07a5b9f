"""Cancellation and timeouts (Ray Serve docs: "Set Up FastAPI and HTTP" → handling client
disconnects, "Request cancellation", HTTPOptions.request_timeout_s; API reference of
DeploymentResponse.cancel): when an HTTP client disconnects before the answer, Serve cancels
the request and the async handler sees asyncio.CancelledError; `DeploymentResponse.cancel()`
cancels a call in flight (the handler sees CancelledError, `.result()` raises a
TaskCancelledError); with http_options request_timeout_s, a request running longer is answered
408 and its handler cancelled. The replica keeps serving throughout."""
import asyncio
import os
import time

import ray
import requests
from ray import serve
from ray.exceptions import TaskCancelledError
from starlette.requests import Request

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment
class Sleeper:
    def __init__(self):
        self.events = []

    async def __call__(self, request: Request):
        tag = request.query_params["tag"]
        return await self.sleep(tag, float(request.query_params.get("s", "10")))

    async def sleep(self, tag: str, seconds: float):
        self.events.append(("start", tag))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.events.append(("cancelled", tag))
            raise
        self.events.append(("done", tag))
        return tag

    def get_events(self):
        return list(self.events)


def wait_event(h, event, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = h.get_events.remote().result(timeout_s=30)
        if event in events:
            return events
        time.sleep(0.1)
    raise AssertionError(f"no {event} in {h.get_events.remote().result(timeout_s=30)}")


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(Sleeper.bind(), name="sleep", route_prefix="/sleep")

    # The client gives up: the handler is cancelled.
    try:
        requests.get(f"{BASE}/sleep", params={"tag": "http"}, timeout=1.0)
    except requests.exceptions.ReadTimeout:
        pass
    else:
        raise AssertionError("a 10 s request answered within 1 s")
    events = wait_event(h, ("cancelled", "http"))
    assert ("done", "http") not in events, events

    # DeploymentResponse.cancel() on a call already running.
    resp = h.sleep.remote("handle", 10)
    wait_event(h, ("start", "handle"))
    resp.cancel()
    t0 = time.monotonic()
    try:
        resp.result(timeout_s=30)
    except TaskCancelledError:
        pass
    else:
        raise AssertionError("a cancelled call returned a result")
    assert time.monotonic() - t0 < 8, time.monotonic() - t0
    wait_event(h, ("cancelled", "handle"))

    # Still serving.
    r = requests.get(f"{BASE}/sleep", params={"tag": "quick", "s": "0"}, timeout=30)
    assert r.status_code == 200 and r.text == "quick", (r.status_code, r.text)

    # An end-to-end HTTP timeout: 408, and the handler is cancelled.
    serve.shutdown()
    serve.start(http_options={"host": "127.0.0.1", "port": PORT, "request_timeout_s": 1})
    h = serve.run(Sleeper.bind(), name="sleep", route_prefix="/sleep")
    t0 = time.monotonic()
    r = requests.get(f"{BASE}/sleep", params={"tag": "timeout"}, timeout=30)
    took = time.monotonic() - t0
    assert r.status_code == 408, (r.status_code, r.text)
    assert took < 8, took
    wait_event(h, ("cancelled", "timeout"))
    r = requests.get(f"{BASE}/sleep", params={"tag": "fast", "s": "0"}, timeout=30)
    assert r.status_code == 200 and r.text == "fast", (r.status_code, r.text)

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
