"""scheduling_strategy="SPREAD", as Ray programs use it: tasks go one per node while nodes have
room, rather than filling the driver's node first; actors go round robin over the nodes."""
import json

from helpers import Cluster, run_python

PROGRAM = """
import time, ray
ray.init()

@ray.remote(num_cpus=1)
def where():
    time.sleep(1.0)  # long enough that every task holds its CPU while the others are placed
    return ray.get_runtime_context().get_node_id()

@ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
class A:
    def node(self):
        return ray.get_runtime_context().get_node_id()

spread = ray.get([where.options(scheduling_strategy="SPREAD").remote() for _ in range(4)])
packed = ray.get([where.remote() for _ in range(2)])
actors = [A.remote() for _ in range(4)]
print("SPREAD", len(set(spread)))
print("DEFAULT", len(set(packed)))
print("ACTORS", len(set(ray.get([a.node.remote() for a in actors]))))
try:
    where.options(scheduling_strategy="EVERYWHERE").remote()
except ValueError as e:
    print("BAD", "EVERYWHERE" in str(e))
"""


def test_spread_puts_tasks_on_different_nodes():
    c = Cluster().start_head("--num-cpus", "4")
    try:
        for _ in range(3):
            c.add_node("--num-cpus", "4")
        nodes = json.loads(c.torus("list", "nodes", "--format", "json").stdout)
        assert len(nodes) == 4
        out = run_python(PROGRAM, env=c.driver_env(RAY_ADDRESS=c.address), shim=True).stdout
        # 4 tasks on 4 nodes of 4 free CPUs each: SPREAD gives each its own node, where the
        # default would run all 4 on the driver's node.
        assert "SPREAD 4" in out, out
        assert "DEFAULT 1" in out, out
        assert "ACTORS 4" in out, out  # round robin: not fooled by a view a heartbeat old
        assert "BAD True" in out, out
    finally:
        c.stop()
