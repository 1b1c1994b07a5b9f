"""Custom health checks (Ray Serve docs: "Configure Ray Serve deployments" → health_check_period_s,
"Add End-to-End Fault Tolerance" → custom check_health): the controller calls a deployment's
`check_health` every health_check_period_s; once it raises (repeatedly), the replica is marked
unhealthy, stopped (its process exits) and replaced by a new replica that serves requests; the
deployment returns to HEALTHY with one running replica."""
import os
import time

import ray
import requests
from ray import serve

PORT = int(os.environ.get("SERVE_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"


@serve.deployment(health_check_period_s=0.5, health_check_timeout_s=5,
                  graceful_shutdown_timeout_s=2, graceful_shutdown_wait_loop_s=0.5)
class Fragile:
    def __init__(self):
        self.broken = False
        self.checks = 0

    def check_health(self):
        self.checks += 1
        if self.broken:
            raise RuntimeError("simulated bad state")

    def break_me(self):
        self.broken = True
        return os.getpid()

    def __call__(self, request=None):
        return {"pid": os.getpid(), "checks": self.checks}


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
    h = serve.run(Fragile.bind(), name="fragile", route_prefix="/fragile")

    first = requests.get(f"{BASE}/fragile", timeout=30).json()
    # check_health runs periodically.
    deadline = time.monotonic() + 20
    while requests.get(f"{BASE}/fragile", timeout=30).json()["checks"] < 3:
        assert time.monotonic() < deadline, "check_health is not being called"
        time.sleep(0.2)

    old_pid = h.break_me.remote().result(timeout_s=30)
    assert old_pid == first["pid"]

    # The broken replica is replaced; requests are answered by the new one.
    deadline = time.monotonic() + 60
    new_pid = None
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"{BASE}/fragile", timeout=10)
            if r.status_code == 200 and r.json()["pid"] != old_pid:
                new_pid = r.json()["pid"]
                break
        except requests.RequestException:
            pass
        time.sleep(0.2)
    assert new_pid is not None, f"the unhealthy replica was not replaced: {serve.status()}"

    deadline = time.monotonic() + 30
    while pid_alive(old_pid):
        assert time.monotonic() < deadline, "the unhealthy replica's process did not exit"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while True:
        dep = serve.status().applications["fragile"].deployments["Fragile"]
        if dep.status == "HEALTHY" and dict(dep.replica_states) == {"RUNNING": 1}:
            break
        assert time.monotonic() < deadline, serve.status()
        time.sleep(0.2)
    for _ in range(5):
        assert requests.get(f"{BASE}/fragile", timeout=30).json()["pid"] == new_pid
        assert h.remote().result(timeout_s=30)["pid"] == new_pid

    serve.shutdown()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
