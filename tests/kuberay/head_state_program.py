"""The head pod's state on a volume (examples/kuberay/cpu.yaml): PHASE=before makes a detached
named actor on a worker pod and gives it state; after the head pod was killed and recreated by
the operator, PHASE=after finds that actor by name through the new head, with its state, and
sees every node of the cluster alive again."""
import os
import time

import ray

ray.init()
phase = os.environ["PHASE"]


@ray.remote(num_cpus=2)  # only a worker pod has 2 CPUs: the actor outlives the head pod
class Keeper:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n


if phase == "before":
    k = Keeper.options(name="keeper", namespace="kuberay", lifetime="detached").remote()
    assert ray.get(k.add.remote(41)) == 41
    print("HEAD STATE BEFORE OK")
else:
    k = ray.get_actor("keeper", namespace="kuberay")
    assert ray.get(k.add.remote(1)) == 42
    deadline = time.time() + 60
    while len([n for n in ray.nodes() if n["Alive"]]) != 3 and time.time() < deadline:
        time.sleep(0.2)
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 3, alive
    print("HEAD STATE AFTER OK")
