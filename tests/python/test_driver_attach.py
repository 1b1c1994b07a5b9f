"""Where a driver attaches: with several nodes on its host (`torus start --address` beside a
head, or `torus up`), to the head's own node, whatever order the head lists them in."""
import json

from helpers import Cluster, run_python


def test_a_driver_attaches_to_the_heads_node(tmp_path):
    c = Cluster().start_head("--num-cpus", "1")
    try:
        for _ in range(3):
            c.add_node("--num-cpus", "1")
        nodes = json.loads(c.torus("list", "nodes", "--format", "json").stdout)
        heads = [n["node_id"] for n in nodes if n["is_head_node"]]
        assert len(nodes) == 4 and len(heads) == 1, nodes
        for _ in range(2):
            out = run_python("""
import ray
ray.init()
print("NODE", ray.get_runtime_context().get_node_id())
""", env=c.driver_env(RAY_ADDRESS=c.address), shim=True).stdout
            assert f"NODE {heads[0]}" in out, (out, heads)
    finally:
        c.stop()
