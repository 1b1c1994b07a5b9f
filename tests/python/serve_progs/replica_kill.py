"""Replica failure recovery (Ray Serve docs: "Add End-to-End Fault Tolerance" → replica
failures: the controller health-checks replicas and restarts a replica that died): a replica's
process SIGKILLed from outside is replaced by a new one in a new process; requests over HTTP and
through the handle succeed again within a bounded wait; the deployment returns to HEALTHY with
one replica and the application to RUNNING."""
import os
import signal
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(health_check_period_s=1, health_check_timeout_s=5)
class Worker:
    def __call__(self, request=None):
        return {"pid": os.getpid(), "replica": serve.get_replica_context().replica_tag}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main():
    ray.init(num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    h = serve.run(Worker.bind(), name="w", route_prefix="/w")

    first = requests.get(f"{BASE}/w", timeout=30).json()
    pid = first["pid"]
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "the replica did not die"

    # Serving resumes from a new process within a bounded wait.
    deadline = time.monotonic() + 60
    new = None
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"{BASE}/w", timeout=10)
            if r.status_code == 200:
                new = r.json()
                break
        except requests.RequestException:
            pass
        time.sleep(0.2)
    assert new is not None, "no successful request within 60 s of the kill"
    assert new["pid"] != pid and new["replica"] != first["replica"], (first, new)

    # Then every request succeeds, over HTTP and through the handle, from the new replica.
    for _ in range(10):
        r = requests.get(f"{BASE}/w", timeout=30)
        assert r.status_code == 200 and r.json()["pid"] == new["pid"], (r.status_code, r.text)
        assert h.remote().result(timeout_s=30)["pid"] == new["pid"]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = serve.status().applications["w"]
        dep = st.deployments["Worker"]
        if st.status == "RUNNING" and dep.status == "HEALTHY" and \
                dict(dep.replica_states) == {"RUNNING": 1}:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"not back to one healthy replica: {serve.status()}")

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
