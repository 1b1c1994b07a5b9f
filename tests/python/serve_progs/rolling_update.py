"""Zero-downtime redeploy (Ray Serve docs: "Updating Applications In-Place" → code updates roll
out replica by replica; "graceful shutdown" drains replicas): while client threads send
requests continuously over HTTP and through a handle, `serve.run` of the same application with
new code (version 2 of the deployment) replaces the replicas; no request fails, the answers switch
from v1 to v2 (mixed while the rollout is under way), and in the end only v2 answers, from two
healthy replicas."""
import os
import threading
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(name="Model", num_replicas=2, graceful_shutdown_wait_loop_s=0.5)
class ModelV1:
    async def __call__(self, request=None):
        import asyncio
        await asyncio.sleep(0.05)
        return "v1"


@serve.deployment(name="Model", num_replicas=2, graceful_shutdown_wait_loop_s=0.5)
class ModelV2:
    async def __call__(self, request=None):
        import asyncio
        await asyncio.sleep(0.05)
        return "v2"


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(ModelV1.bind(), name="roll", route_prefix="/roll")
    assert requests.get(f"{BASE}/roll", timeout=30).text == "v1"

    stop = threading.Event()
    lock = threading.Lock()
    seen = {"http": [], "handle": []}
    failures = []

    def http_client():
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    r = s.get(f"{BASE}/roll", timeout=30)
                    with lock:
                        if r.status_code == 200:
                            seen["http"].append(r.text)
                        else:
                            failures.append(("http", r.status_code, r.text[:200]))
                except requests.RequestException as e:
                    with lock:
                        failures.append(("http", repr(e)))

    def handle_client():
        while not stop.is_set():
            try:
                v = h.remote().result(timeout_s=30)
                with lock:
                    seen["handle"].append(v)
            except Exception as e:
                with lock:
                    failures.append(("handle", repr(e)))

    threads = [threading.Thread(target=f, daemon=True)
               for f in (http_client, http_client, handle_client)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        serve.run(ModelV2.bind(), name="roll", route_prefix="/roll")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                tail_http, tail_handle = seen["http"][-10:], seen["handle"][-5:]
            if len(tail_http) == 10 and set(tail_http) == {"v2"} and \
                    len(tail_handle) == 5 and set(tail_handle) == {"v2"}:
                break
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)

    assert not failures, failures[:10]
    for kind in ("http", "handle"):
        answers = seen[kind]
        assert answers and answers[0] == "v1", (kind, answers[:5])
        assert answers[-1] == "v2", (kind, answers[-5:])
        assert set(answers) == {"v1", "v2"}, set(answers)
    for _ in range(10):
        assert requests.get(f"{BASE}/roll", timeout=30).text == "v2"
    dep = serve.status().applications["roll"].deployments["Model"]
    assert dep.status == "HEALTHY" and dict(dep.replica_states) == {"RUNNING": 2}, dep

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
