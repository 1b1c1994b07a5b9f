"""GPU ids as Ray gives them (no physical GPU needed: the GPUs are declared to ray.init): a task
or actor that asks for GPUs gets whole ones of its own, or a share of one, and sees their ids in
ray.get_gpu_ids() and CUDA_VISIBLE_DEVICES; work that asks for none sees none."""
from helpers import run_python

PROGRAM = """
import os, time, ray
ray.init(address="local", num_cpus=4, num_gpus=2)

@ray.remote
def ids(hold=0.0):
    time.sleep(hold)  # overlap with the others, so each holds its GPU while they run
    return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

@ray.remote(num_gpus=1)
class OnGpu:
    def ids(self):
        return ray.get_gpu_ids()

whole = ray.get([ids.options(num_gpus=1).remote(0.5) for _ in range(2)])
print("WHOLE", sorted(tuple(g) for g, _ in whole), sorted(v for _, v in whole))
print("BOTH", ray.get(ids.options(num_gpus=2).remote()))
halves = ray.get([ids.options(num_gpus=0.5).remote(0.5) for _ in range(4)])
print("HALVES", sorted(tuple(g) for g, _ in halves))
print("NONE", ray.get(ids.remote()))
a = OnGpu.remote()
print("ACTOR", ray.get(a.ids.remote()))
"""


def test_gpu_ids_are_given_whole_or_shared_and_seen_by_the_work():
    out = run_python(PROGRAM, shim=True).stdout
    assert "WHOLE [(0,), (1,)] ['0', '1']" in out, out
    assert "BOTH ([0, 1], '0,1')" in out, out
    assert "HALVES [(0,), (0,), (1,), (1,)]" in out, out  # two halves on each GPU
    assert "NONE ([], None)" in out, out
    assert "ACTOR [0]" in out or "ACTOR [1]" in out, out
