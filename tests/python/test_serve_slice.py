"""Serve replicas on TPU slices, on a `torus up` cluster of two simulated v6e 4x4 slices (8 hosts
x 4 chips): a deployment with `placement_group_bundles=[{"TPU": 4}] * 4` gets one whole slice
per replica (4 ranks, one per host of one slice, rank = worker id), every call runs on every
rank, a SIGKILLed rank replaces the whole replica on a whole slice; and the OpenAI-compatible
example (examples/serve_llm) answers the `openai` client on a slice, streaming and not."""
import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers import REPO, cluster_up, free_port

PROGRAM = """
import json, os, sys, time
import ray, requests
from ray import serve

OUT = sys.argv[1]
PORT = int(sys.argv[2])

@serve.deployment(placement_group_bundles=[{"TPU": 4}] * 4,
                  ray_actor_options={"num_cpus": 0, "resources": {"TPU": 4}},
                  health_check_period_s=1)
class SliceModel:
    def __init__(self):
        ctx = serve.get_replica_context()
        self.rank, self.world = ctx.rank, ctx.world_size
        self.me = {"rank": ctx.rank, "world": ctx.world_size, "pid": os.getpid(),
                   "slice": os.environ.get("TPU_NAME"), "worker": os.environ.get("TPU_WORKER_ID"),
                   "coordinator": os.environ.get("JAX_COORDINATOR_ADDRESS"),
                   "replica": ctx.replica_tag}
        self.calls = 0

    def __call__(self, request):
        self.calls += 1
        with open(os.path.join(OUT, f"{self.me['replica']}-{self.rank}.json"), "w") as f:
            json.dump(dict(self.me, calls=self.calls), f)
        return dict(self.me, calls=self.calls)

ray.init()
serve.start(http_options={"host": "127.0.0.1", "port": PORT})
serve.run(SliceModel.bind(), name="slice", route_prefix="/")
for _ in range(3):
    r = requests.get(f"http://127.0.0.1:{PORT}/", timeout=30)
    assert r.status_code == 200, r.text
first = r.json()
print("FIRST", json.dumps(first), flush=True)
# The test kills a rank now; wait for a replica with new processes to answer.
deadline = time.time() + 120
while time.time() < deadline:
    if os.path.exists(os.path.join(OUT, "killed")):
        break
    time.sleep(0.1)
deadline = time.time() + 120
second = None
while time.time() < deadline:
    try:
        r = requests.get(f"http://127.0.0.1:{PORT}/", timeout=30)
        if r.status_code == 200 and r.json()["replica"] != first["replica"]:
            second = r.json()
            break
    except Exception:
        pass
    time.sleep(0.2)
assert second is not None, "no new replica answered within 120 s"
r = requests.get(f"http://127.0.0.1:{PORT}/", timeout=30)
print("SECOND", json.dumps(r.json()), flush=True)
serve.shutdown()
print("OK", flush=True)
"""


def _ranks(out: Path, replica: str):
    found = {}
    for p in out.glob(f"{replica}-*.json"):
        d = json.loads(p.read_text())
        found[d["rank"]] = d
    return found


def test_a_slice_replica_holds_one_whole_slice_and_is_replaced_whole(tmp_path):
    text = (REPO / "examples" / "clusters" / "v6e-4x4-3-slices.yaml").read_text()
    manifest = tmp_path / "two-slices.yaml"
    manifest.write_text(text.replace("replicas: 3", "replicas: 2")
                        .replace("maxReplicas: 3", "maxReplicas: 2"))
    out = tmp_path / "ranks"
    out.mkdir()
    port = free_port()
    with cluster_up(str(manifest)) as c:
        import subprocess
        import sys
        import tempfile
        d = tempfile.mkdtemp(prefix="torus-py-")
        prog = Path(d) / "prog.py"
        prog.write_text(PROGRAM)
        p = subprocess.Popen([sys.executable, "-m", "torus.ray", str(prog), str(out), str(port)],
                             env=c.driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=d)
        try:
            first = None
            deadline = time.time() + 180
            while time.time() < deadline and first is None:
                line = p.stdout.readline()
                if not line:
                    break
                if line.startswith("FIRST "):
                    first = json.loads(line[len("FIRST "):])
            assert first is not None, p.stderr.read()[-3000:]
            ranks = _ranks(out, first["replica"])
            # Every call ran on all 4 ranks, one per host of one slice, rank = worker id.
            assert sorted(ranks) == [0, 1, 2, 3], ranks
            assert {r["calls"] for r in ranks.values()} == {3}, ranks
            assert len({r["slice"] for r in ranks.values()}) == 1, ranks
            assert all(r["worker"] == str(i) for i, r in ranks.items()), ranks
            assert len({r["coordinator"] for r in ranks.values()}) == 1, ranks
            victim = ranks[2]["pid"]
            os.kill(victim, signal.SIGKILL)
            (out / "killed").write_text("1")
            stdout, stderr = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, (stdout[-2000:], stderr[-4000:])
        second = json.loads(stdout.split("SECOND ", 1)[1].splitlines()[0])
        new = _ranks(out, second["replica"])
        assert sorted(new) == [0, 1, 2, 3], new
        assert len({r["slice"] for r in new.values()}) == 1, new
        old_pids = {r["pid"] for r in ranks.values()}
        assert not old_pids & {r["pid"] for r in new.values()}, (ranks, new)
        for pid in old_pids:  # the whole old replica is gone, not just the killed rank
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"rank process {pid} of the replaced replica still runs")


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs JAX (jax_venv.sh)")
def test_openai_client_talks_to_a_model_served_on_a_whole_slice(tmp_path):
    import tempfile
    from helpers import one_v6e_slice_manifest, run
    import sys
    manifest = one_v6e_slice_manifest(tmp_path)
    with cluster_up(manifest) as c:
        p = run([sys.executable, "-m", "torus.ray", str(REPO / "examples" / "serve_llm" / "run.py"),
                 "--port", str(free_port())], env=c.driver_env(), timeout=400, check=False,
                cwd=tempfile.mkdtemp())
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), (p.stdout[-3000:],
                                                                   p.stderr[-5000:])
    assert "replica rank 0 of 4" in p.stdout and "16 devices" in p.stdout, p.stdout


AUTOSCALE = """
import json, os, sys, threading, time
import ray, requests
from ray import serve

OUT, PORT = sys.argv[1], int(sys.argv[2])

@serve.deployment(placement_group_bundles=[{"TPU": 4}] * 4,
                  ray_actor_options={"num_cpus": 0, "resources": {"TPU": 4}},
                  max_ongoing_requests=1,
                  autoscaling_config={"min_replicas": 1, "max_replicas": 2,
                                      "target_ongoing_requests": 1, "upscale_delay_s": 0,
                                      "downscale_delay_s": 2, "metrics_interval_s": 0.2,
                                      "look_back_period_s": 0.5})
class Sliced:
    def __init__(self):
        self.slice = os.environ.get("TPU_NAME")
    def __call__(self, request):
        time.sleep(0.3)
        return self.slice

def running():
    st = serve.status().applications["auto"].deployments["Sliced"].replica_states
    return {str(getattr(k, "value", k)): v for k, v in st.items()}.get("RUNNING", 0)

def wait_for(flag):
    while not os.path.exists(os.path.join(OUT, flag)):
        time.sleep(0.1)

ray.init()
serve.start(http_options={"host": "127.0.0.1", "port": PORT})
serve.run(Sliced.bind(), name="auto", route_prefix="/")
stop = threading.Event()
seen = set()
def client():
    while not stop.is_set():
        try:
            seen.add(requests.get(f"http://127.0.0.1:{PORT}/", timeout=60).text)
        except Exception:
            pass
threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
for t in threads:
    t.start()
deadline = time.time() + 120
while running() < 2 and time.time() < deadline:
    time.sleep(0.2)
time.sleep(2)
print("UP", running(), json.dumps(sorted(seen)), flush=True)
wait_for("checked_up")
stop.set()
for t in threads:
    t.join()
deadline = time.time() + 120
while running() != 1 and time.time() < deadline:
    time.sleep(0.2)
time.sleep(1)
print("DOWN", running(), flush=True)
wait_for("checked_down")
serve.shutdown()
print("OK", flush=True)
"""


def _reserved(c):
    return [line.split()[0] for line in c.torus("list", "slices").stdout.splitlines()[1:]
            if " reserved " in f" {line} "]


def test_autoscaling_a_slice_deployment_adds_and_removes_whole_slices(tmp_path):
    import subprocess
    import sys
    import tempfile
    text = (REPO / "examples" / "clusters" / "v6e-4x4-3-slices.yaml").read_text()
    manifest = tmp_path / "two-slices.yaml"
    manifest.write_text(text.replace("replicas: 3", "replicas: 2")
                        .replace("maxReplicas: 3", "maxReplicas: 2"))
    out = tmp_path / "flags"
    out.mkdir()
    with cluster_up(str(manifest)) as c:
        d = tempfile.mkdtemp(prefix="torus-py-")
        prog = Path(d) / "prog.py"
        prog.write_text(AUTOSCALE)
        p = subprocess.Popen([sys.executable, "-m", "torus.ray", str(prog), str(out),
                              str(free_port())], env=c.driver_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=d)
        try:
            up = p.stdout.readline()
            assert up.startswith("UP 2 "), (up, p.stderr.read()[-3000:] if not up else "")
            # Two replicas, each on a whole slice of its own: both slices reserved, and the
            # answers came from both.
            assert sorted(_reserved(c)) == ["tpu-v6e-0", "tpu-v6e-1"], c.torus("list",
                                                                             "slices").stdout
            assert json.loads(up.split(" ", 2)[2]) == ["tpu-v6e-0", "tpu-v6e-1"], up
            (out / "checked_up").write_text("1")
            down = p.stdout.readline()
            assert down.startswith("DOWN 1"), down
            deadline = time.time() + 30
            while len(_reserved(c)) != 1 and time.time() < deadline:
                time.sleep(0.5)
            assert len(_reserved(c)) == 1, c.torus("list", "slices").stdout
            (out / "checked_down").write_text("1")
            stdout, stderr = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0 and stdout.strip().endswith("OK"), stderr[-3000:]
        deadline = time.time() + 30
        while _reserved(c) and time.time() < deadline:
            time.sleep(0.5)
        assert _reserved(c) == [], c.torus("list", "slices").stdout
