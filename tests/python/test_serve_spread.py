"""`max_replicas_per_node` (Ray's meaning): no node runs more than that many replicas of the
deployment; a replica no node can take waits (the deployment says why) and starts once a node
joins; bad values are refused with Ray's messages."""
import subprocess
import sys

import pytest

from helpers import Cluster

PROGRAM = """
import sys, time, ray
from ray import serve

@serve.deployment(num_replicas=3, max_replicas_per_node=1, ray_actor_options={"num_cpus": 0})
class Where:
    def __call__(self, request=None):
        return ray.get_runtime_context().get_node_id()

def running():
    st = serve.status().applications["spread"].deployments["Where"]
    return st.replica_states.get("RUNNING", 0), st.message

def nodes(h):
    return len({h.remote().result() for _ in range(60)})

ray.init()
h = serve.run(Where.bind(), name="spread", route_prefix="/spread", _blocking=False)
deadline = time.time() + 60
while running()[0] < 2 and time.time() < deadline:
    time.sleep(0.1)
time.sleep(1.5)  # room for a wrong third replica to show up
print("TWO", running()[0], nodes(h), "max_replicas_per_node=1" in running()[1], flush=True)
sys.stdin.readline()  # a third node joined
deadline = time.time() + 60
while running()[0] < 3 and time.time() < deadline:
    time.sleep(0.1)
print("THREE", running()[0], nodes(h), flush=True)
serve.shutdown()
"""


def test_max_replicas_per_node_spreads_and_waits_for_room(tmp_path):
    c = Cluster().start_head("--num-cpus", "1")
    try:
        c.add_node("--num-cpus", "1")
        script = tmp_path / "spread.py"
        script.write_text(PROGRAM)
        p = subprocess.Popen([sys.executable, "-m", "torus.ray", str(script)],
                             env=c.driver_env(RAY_ADDRESS=c.address), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path)
        try:
            line = p.stdout.readline()
            assert line.split() == ["TWO", "2", "2", "True"], line
            c.add_node("--num-cpus", "1")
            p.stdin.write("\n")
            p.stdin.flush()
            line = p.stdout.readline()
            assert line.split() == ["THREE", "3", "3"], line
            assert p.wait(timeout=60) == 0
        finally:
            p.kill()
    finally:
        c.stop()


def test_bad_max_replicas_per_node_values_are_refused():
    from torus import serve
    for bad, kind, text in ((0, ValueError, "Invalid max_replicas_per_node 0"),
                            (101, ValueError, "Invalid max_replicas_per_node 101"),
                            ("2", TypeError, "max_replicas_per_node"),
                            (True, TypeError, "max_replicas_per_node")):
        with pytest.raises(kind, match=text):
            serve.deployment(max_replicas_per_node=bad)(lambda: None)
    with pytest.raises(ValueError, match="not allowed when placement_group_bundles"):
        serve.deployment(max_replicas_per_node=1,
                              placement_group_bundles=[{"CPU": 1}])(lambda: None)
