"""Dead nodes age out of the head's table (`torus start --head --keep-dead-nodes N`, Ray's
maximum_gcs_dead_node_cached_count): the longest dead are forgotten first, the cluster keeps
serving, and a forgotten node's host can join again."""
import json
import os
import signal

from helpers import Cluster, run_python, wait_until


def _nodes(c):
    return json.loads(c.torus("list", "nodes", "--format", "json").stdout)


def test_dead_nodes_beyond_the_limit_are_forgotten_longest_dead_first():
    c = Cluster().start_head("--num-cpus", "1", "--keep-dead-nodes", "2", "--node-timeout-ms", "1000")
    try:
        for _ in range(5):
            c.add_node("--num-cpus", "1")
        nodes = _nodes(c)
        workers = [n for n in nodes if not n["is_head_node"]]
        assert len(nodes) == 6 and len(workers) == 5, nodes
        died = []  # node ids in the order they were killed and declared dead
        for n in workers[:4]:
            os.kill(n["pid"], signal.SIGKILL)
            wait_until(lambda: any(m["node_id"] == n["node_id"] and m["state"] == "DEAD" for m in _nodes(c))
                       or all(m["node_id"] != n["node_id"] for m in _nodes(c)),
                       timeout=30, what=f"node {n['node_id']} declared dead")
            died.append(n["node_id"])
        # At most two dead nodes are kept: the two killed last.
        wait_until(lambda: sum(m["state"] == "DEAD" for m in _nodes(c)) <= 2, timeout=10,
                   what="dead nodes beyond the limit forgotten")
        nodes = _nodes(c)
        listed = {m["node_id"]: m["state"] for m in nodes}
        assert [listed.get(i) for i in died] == [None, None, "DEAD", "DEAD"], nodes
        assert sum(m["state"] == "ALIVE" for m in nodes) == 2, nodes
        # The cluster keeps serving: work runs, a new node joins and is used.
        c.add_node("--num-cpus", "1", "--resources", '{"late": 1}')
        wait_until(lambda: sum(m["state"] == "ALIVE" for m in _nodes(c)) == 3, timeout=30,
                   what="the new node alive")
        out = run_python("""
import ray
ray.init()
@ray.remote(resources={"late": 1})
def where():
    return ray.get_runtime_context().get_node_id()
@ray.remote
def double(x):
    return x * 2
print("SUM", sum(ray.get([double.remote(i) for i in range(20)])))
print("ON", ray.get(where.remote()))
""", env=c.driver_env(RAY_ADDRESS=c.address), shim=True).stdout
        assert "SUM 380" in out, out
        late = [m["node_id"] for m in _nodes(c) if m["state"] == "ALIVE" and not m["is_head_node"]
                and m["node_id"] not in listed]
        assert len(late) == 1 and f"ON {late[0]}" in out, (out, late)
    finally:
        c.stop()
