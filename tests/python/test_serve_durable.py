"""Serve outlives its controller and the head (docs/serve.md): the controller's state is in the
head's durable KV store, its replicas and proxies are detached actors. A SIGKILLed controller
restarts, finds its replicas again (same processes) and takes new deployments; a kill -9 of the
head and the same `torus start --head` command leave traffic flowing (proxy to replica needs no
head) and Serve manageable afterwards."""
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

from helpers import Cluster, free_port, run_python

DEPLOY = """
import os, ray
from ray import serve
ray.init()
serve.start(http_options={"host": "127.0.0.1", "port": PORT})
@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=2)
def pid(request):
    return f"VERSION {os.getpid()}"
serve.run(pid.bind(), name="app", route_prefix="/")
c = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
print("CONTROLLER", ray.get(c.pid.remote()), flush=True)
"""

CHECK = """
import ray
from ray import serve
ray.init()
st = serve.status()
app = st.applications["app"]
print("STATUS", app.status.value, dict((k.value, v) for k, v in app.deployments["pid"].replica_states.items()))
"""


def _get(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
        return r.read().decode()


class Poller:
    """Sends requests in a loop; counts answers and failures."""

    def __init__(self, port):
        self.port, self.ok, self.failed, self.pids = port, 0, [], set()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                self.pids.add(_get(self.port).split()[-1])
                self.ok += 1
            except Exception as e:
                self.failed.append(repr(e))
            time.sleep(0.02)

    def end(self):
        self.stop.set()
        self.t.join()


def _serve_pids(port, n=20):
    return {_get(port).split()[-1] for _ in range(n)}


def _cluster():
    c = Cluster()
    port = str(free_port())
    c.torus("start", "--head", "--port", port, "--num-cpus", "4")
    c.session = str((Path(c.root) / "session_latest").resolve())
    return c, port, c.env | {"RAY_ADDRESS": f"127.0.0.1:{port}"}


def test_a_killed_controller_comes_back_with_its_replicas():
    c, _, env = _cluster()
    http = free_port()
    try:
        out = run_python(DEPLOY.replace("VERSION", "v1").replace("PORT", str(http)), env=env,
                         shim=True).stdout
        ctl = int(out.split("CONTROLLER ")[1].split()[0])
        before = _serve_pids(http)
        assert len(before) == 2, before
        poll = Poller(http)
        time.sleep(0.5)
        os.kill(ctl, signal.SIGKILL)
        time.sleep(3)
        poll.end()
        assert poll.ok > 20 and not poll.failed, (poll.ok, poll.failed[:5])
        out = run_python(CHECK, env=env, shim=True).stdout
        assert "STATUS RUNNING {'RUNNING': 2}" in out, out
        assert _serve_pids(http) == before  # the same replicas, found again by the new one
        out = run_python(DEPLOY.replace("VERSION", "v2").replace("PORT", str(http)), env=env,
                         shim=True).stdout
        assert int(out.split("CONTROLLER ")[1].split()[0]) != ctl
        deadline = time.time() + 30
        while not _get(http).startswith("v2") and time.time() < deadline:
            time.sleep(0.1)
        assert _get(http).startswith("v2")
    finally:
        c.torus("stop", check=False)


def test_serve_rides_out_a_head_restart():
    c, port, env = _cluster()
    http = free_port()
    try:
        run_python(DEPLOY.replace("VERSION", "v1").replace("PORT", str(http)), env=env,
                   shim=True)
        before = _serve_pids(http)
        poll = Poller(http)
        time.sleep(0.5)
        pid = int((Path(c.session) / "pids" / "head.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.5)
        p = c.torus("start", "--head", "--port", port, "--num-cpus", "4")
        assert "resumed" in p.stdout, p.stdout
        time.sleep(2)
        poll.end()
        assert poll.ok > 20 and not poll.failed, (poll.ok, poll.failed[:5])
        out = run_python(CHECK, env=env, shim=True).stdout
        assert "STATUS RUNNING {'RUNNING': 2}" in out, out
        assert _serve_pids(http) == before
        run_python(DEPLOY.replace("VERSION", "v2").replace("PORT", str(http)), env=env,
                   shim=True)
        deadline = time.time() + 30
        while not _get(http).startswith("v2") and time.time() < deadline:
            time.sleep(0.1)
        assert _get(http).startswith("v2")
        run_python("import ray\nfrom ray import serve\nray.init()\nserve.shutdown()\n",
                   env=env, shim=True)
        try:
            _get(http)
            raise AssertionError("the port still answers after serve.shutdown()")
        except OSError:
            pass
    finally:
        c.torus("stop", check=False)
