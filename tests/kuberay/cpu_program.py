"""A Ray program for the CPU cluster of examples/kuberay/cpu.yaml, run in its head pod: every node
alive, tasks on each of the three pods, an actor keeping state, an object passed between nodes."""
import socket
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()
deadline = time.time() + 60
while len([n for n in ray.nodes() if n["Alive"]]) != 3 and time.time() < deadline:
    time.sleep(0.2)
alive = [n for n in ray.nodes() if n["Alive"]]
assert len(alive) == 3, alive


@ray.remote(num_cpus=1)
def where(x):
    time.sleep(0.2)
    return socket.gethostname(), x * 2


@ray.remote
class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n


big = ray.put(list(range(100_000)))
on = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in alive]
results = ray.get([where.options(scheduling_strategy=on[i % 3]).remote(i) for i in range(12)])
assert sorted(v for _, v in results) == [2 * i for i in range(12)], results
hosts = {h for h, _ in results}
assert len(hosts) == 3, hosts  # one per pod: each pod has its own hostname
c = Counter.remote()
assert ray.get([c.add.remote(i) for i in range(10)])[-1] == 45
assert ray.get(ray.remote(lambda v: sum(v)).remote(big)) == sum(range(100_000))
print(f"CPU CLUSTER OK: {len(alive)} nodes, tasks on {len(hosts)} hosts")
