"""Scale to zero (Ray Serve docs: "Ray Serve Autoscaling" → min_replicas=0): a deployment with
autoscaling min_replicas=0 starts with no replica (initial_replicas defaults to min_replicas)
and its application is RUNNING; a request (over HTTP, or through a handle) is held until a
replica starts and then answered; after the traffic stops and downscale_delay_s passes the
deployment goes back to zero replicas; the next request brings up a new replica again."""
import os
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(autoscaling_config={
    "min_replicas": 0,
    "max_replicas": 2,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 2,
    "metrics_interval_s": 0.5,
    "look_back_period_s": 1,
}, graceful_shutdown_timeout_s=5, graceful_shutdown_wait_loop_s=0.5)
class Lazy:
    def __call__(self, request=None):
        return str(os.getpid())


def replicas() -> dict:
    return dict(serve.status().applications["zero"].deployments["Lazy"].replica_states)


def wait_for_zero(what: str):
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        if sum(replicas().values()) == 0:
            return
        time.sleep(0.3)
    raise AssertionError(f"{what}: not scaled to zero: {serve.status()}")


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(Lazy.bind(), name="zero", route_prefix="/zero")
    st = serve.status().applications["zero"]
    assert st.status == "RUNNING", st
    assert sum(replicas().values()) == 0, replicas()

    # A request to a deployment at zero waits for a cold start and succeeds.
    t0 = time.monotonic()
    r = requests.get(f"{BASE}/zero", timeout=60)
    cold = time.monotonic() - t0
    assert r.status_code == 200, (r.status_code, r.text)
    pid1 = r.text
    assert replicas().get("RUNNING", 0) >= 1, replicas()

    wait_for_zero("after the HTTP request")
    # And through a handle.
    pid2 = h.remote().result(timeout_s=60)
    assert pid2 != pid1, (pid1, pid2)
    wait_for_zero("after the handle request")
    print(f"cold start {cold:.1f} s")

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
