"""DataContext knobs (Ray Data docs "Execution configurations", "Performance tips" > block
size; API DataContext, ExecutionOptions, ExecutionResources): DataContext.get_current() is the
driver's context and, as its docs say, is propagated to the workers that run a dataset's tasks;
target_max_block_size bounds the blocks a read or transform produces (a one-block 8 MB read
with a 1 MiB target comes out as several blocks, each about that size at most);
execution_options.resource_limits caps what an execution uses (cpu=1: one map task at a time;
object_store_memory set low: a pipeline far larger still completes)."""
import time

import numpy as np

import ray
from ray.data import DataContext, ExecutionResources

MIB = 1 << 20


def check_block_size():
    ctx = DataContext.get_current()
    default = ctx.target_max_block_size
    one = ray.data.range(1_000_000, override_num_blocks=1).materialize()  # 8 MB of int64
    assert one.num_blocks() == 1, one.num_blocks()
    ctx.target_max_block_size = 1 * MIB
    try:
        small = ray.data.range(1_000_000, override_num_blocks=1).materialize()
        assert small.num_blocks() >= 6, small.num_blocks()
        assert small.count() == 1_000_000
        sizes = [len(b["id"]) * 8 for b in small.iter_batches(batch_size=None)]
        assert max(sizes) <= 2 * MIB, sizes

        def seen(batch):
            size = DataContext.get_current().target_max_block_size
            return {"size": np.full(len(batch["id"]), size)}

        sizes = {r["size"] for r in ray.data.range(10).map_batches(seen).take_all()}
        assert sizes == {MIB}, sizes  # the driver's context reached the task
    finally:
        ctx.target_max_block_size = default


@ray.remote
class Gauge:
    def __init__(self):
        self.now = self.peak = 0

    def enter(self):
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self):
        self.now -= 1

    def get_peak(self):
        return self.peak


def check_resource_limits():
    ctx = DataContext.get_current()
    before = ctx.execution_options.resource_limits
    gauge = Gauge.remote()

    def slow(batch):
        ray.get(gauge.enter.remote())
        time.sleep(0.1)
        ray.get(gauge.leave.remote())
        return batch

    ctx.execution_options.resource_limits = ExecutionResources(cpu=1)
    try:
        assert ray.data.range(80, override_num_blocks=8).map_batches(slow).count() == 80
        assert ray.get(gauge.get_peak.remote()) == 1
    finally:
        ctx.execution_options.resource_limits = before

    ctx.execution_options.resource_limits = ExecutionResources(object_store_memory=32 * MIB)
    try:
        ds = ray.data.range(64, override_num_blocks=64).map_batches(
            lambda b: {"x": np.ones((len(b["id"]), MIB // 8))})   # 64 MiB in all
        assert ctx.execution_options.resource_limits.object_store_memory == 32 * MIB
        rows = sum(len(b["x"]) for b in ds.iter_batches(batch_size=4))
        assert rows == 64
    finally:
        ctx.execution_options.resource_limits = before


def main():
    ray.init(num_cpus=4)
    check_block_size()
    check_resource_limits()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
