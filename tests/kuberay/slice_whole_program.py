"""After a slice host's pod was recreated: the v6e 4x4 slice is whole again. One whole slice is
reserved, a task runs on each of its 4 hosts, and the hosts answer as TPU workers 0-3 of one
slice, each in its own pod."""
import os
import socket

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import slice_placement_group

ray.init()
spg = slice_placement_group(topology="4x4", accelerator_version="v6e")
ray.get(spg.placement_group.ready(), timeout=300)


@ray.remote(resources={"TPU": 4})
def host():
    return os.environ.get("TPU_NAME"), int(os.environ["TPU_WORKER_ID"]), socket.gethostname()


on = [PlacementGroupSchedulingStrategy(placement_group=spg.placement_group,
                                       placement_group_bundle_index=i) for i in range(spg.num_hosts)]
res = ray.get([host.options(scheduling_strategy=s).remote() for s in on], timeout=300)
assert sorted(r[1] for r in res) == [0, 1, 2, 3], res
assert len({r[0] for r in res}) == 1 and len({r[2] for r in res}) == 4, res
spg.shutdown()
print("SLICE WHOLE OK", res)
