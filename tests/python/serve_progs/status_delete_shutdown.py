"""Application lifecycle (Ray Serve docs: "Monitor your application" → serve.status(), API
reference of serve.delete and serve.shutdown): serve.status() lists each running application as
RUNNING with its deployments HEALTHY and their replica counts; serve.delete(name) removes one
application (requests in flight complete first; then its route answers 404, serve.status() no
longer lists it, its replica processes exit, a handle to it fails) and leaves the other
serving; serve.shutdown() closes the HTTP port
(connection refused) and every replica process exits."""
import os
import socket
import tempfile
import threading
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(num_replicas=2)
class Keep:
    def __call__(self, request=None):
        return str(os.getpid())


@serve.deployment
class Doomed:
    def __init__(self, marker_dir: str):
        self.marker_dir = marker_dir

    async def __call__(self, request=None):
        if request is not None and not hasattr(request, "query_params"):
            tag = request  # a handle call: the tag of a slow call
        else:
            tag = request.query_params.get("slow") if request is not None else None
        if tag:
            import asyncio
            with open(os.path.join(self.marker_dir, tag), "w"):
                pass
            await asyncio.sleep(2)
            return f"finished {tag}"
        return str(os.getpid())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_gone(pids, what: str, timeout=40):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if pid_alive(p)]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: replica processes {left} still exist")


def pids_of(url: str, want: int, timeout=30) -> set:
    seen = set()
    deadline = time.monotonic() + timeout
    with requests.Session() as s:
        while len(seen) < want and time.monotonic() < deadline:
            r = s.get(url, timeout=30)
            assert r.status_code == 200, (url, r.status_code, r.text)
            seen.add(int(r.text))
    assert len(seen) == want, (url, seen)
    return seen


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Keep.bind(), name="keep", route_prefix="/keep")
    marker_dir = tempfile.mkdtemp(prefix="serve-delete-")
    serve.run(Doomed.bind(marker_dir), name="doomed", route_prefix="/doomed")

    status = serve.status()
    assert set(status.applications) == {"keep", "doomed"}, status.applications
    for app, dep, n in (("keep", "Keep", 2), ("doomed", "Doomed", 1)):
        a = status.applications[app]
        assert a.status == "RUNNING", (app, a)
        d = a.deployments[dep]
        assert d.status == "HEALTHY", (app, d)
        assert dict(d.replica_states) == {"RUNNING": n}, (app, d.replica_states)
    assert set(status.applications["keep"].deployments) == {"Keep"}

    keep_pids = pids_of(f"{BASE}/keep", 2)
    doomed_pids = pids_of(f"{BASE}/doomed", 1)
    h = serve.get_app_handle("doomed")
    assert int(h.remote().result(timeout_s=30)) in doomed_pids

    # Requests in flight when the application is deleted still complete.
    in_flight = {}

    def slow_http():
        r = requests.get(f"{BASE}/doomed", params={"slow": "http"}, timeout=60)
        in_flight["http"] = (r.status_code, r.text)

    t = threading.Thread(target=slow_http)
    t.start()
    slow_call = h.remote("handle")
    deadline = time.monotonic() + 30
    while len(os.listdir(marker_dir)) < 2:
        assert time.monotonic() < deadline, os.listdir(marker_dir)
        time.sleep(0.05)

    serve.delete("doomed")
    t.join(60)
    assert in_flight.get("http") == (200, "finished http"), in_flight
    assert slow_call.result(timeout_s=30) == "finished handle"
    assert "doomed" not in serve.status().applications, serve.status()
    deadline = time.monotonic() + 20
    while requests.get(f"{BASE}/doomed", timeout=30).status_code != 404:
        assert time.monotonic() < deadline, "the deleted application's route still answers"
        time.sleep(0.2)
    wait_gone(doomed_pids, "after serve.delete")
    try:
        serve.get_app_handle("doomed").remote().result(timeout_s=10)
    except Exception:
        pass
    else:
        raise AssertionError("a handle to the deleted application answered")
    # The other application is untouched.
    assert pids_of(f"{BASE}/keep", 2) == keep_pids
    assert serve.status().applications["keep"].status == "RUNNING"
    # Deleting an application that does not exist is not an error.
    serve.delete("never-existed")

    serve.shutdown()
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=2):
                pass
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "the HTTP port is still open after serve.shutdown()"
        time.sleep(0.2)
    wait_gone(keep_pids, "after serve.shutdown")

    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
