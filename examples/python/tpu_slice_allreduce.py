"""The Ray-on-TPU pattern, unchanged Ray code: reserve one whole v6e 4x4 slice (16 chips on 4
hosts) atomically, run one task per host in it, and have those tasks join one JAX program
(jax.distributed) that all-reduces over every device of the slice.

    python -m torus.ray examples/python/tpu_slice_allreduce.py      # on a `torus up` cluster

On the simulated cluster of `torus up` the chips are CPU devices (4 per host process, XLA's
host-platform device count) and the collectives go over gloo. Rank r holds the values
4r+1 .. 4r+4, so the sum over the 16 devices is 136 on every rank; the program exits 1 on any
other value.
"""
import os
import socket
import sys

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import slice_placement_group


@ray.remote(resources={"TPU": 4})
def coordinator_address():
    """A free port on the slice's first host, for jax.distributed's coordinator."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{socket.gethostbyname(socket.gethostname())}:{port}"


@ray.remote(resources={"TPU": 4})
def worker(rank, world, coordinator, devices_per_host):
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_host}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np
    from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=world,
                               process_id=rank, initialization_timeout=120)
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("x",))
    local = np.array([[rank * devices_per_host + j + 1] for j in range(devices_per_host)],
                     dtype=np.int32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local,
                                               (len(devices), 1))
    psum = jax.jit(shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                             out_specs=P()))
    total = int(np.asarray(psum(x).addressable_data(0)).reshape(-1)[0])
    jax.distributed.shutdown()
    host = f"{os.environ.get('TPU_NAME', '?')}/worker {os.environ.get('TPU_WORKER_ID', '?')}"
    return rank, host, len(devices), total


def main():
    spg = slice_placement_group(topology="4x4", accelerator_version="v6e")
    ray.get(spg.placement_group.ready(), timeout=600)
    print(f"reserved a {spg.accelerator_version} {spg.topology} slice: {spg.num_hosts} hosts x "
          f"{spg.chips_per_host} chips", flush=True)

    def on_host(i):
        return PlacementGroupSchedulingStrategy(placement_group=spg.placement_group,
                                                placement_group_bundle_index=i)

    coordinator = ray.get(coordinator_address.options(scheduling_strategy=on_host(0)).remote())
    tasks = [
        worker.options(scheduling_strategy=on_host(i)).remote(
            rank=i, world=spg.num_hosts, coordinator=coordinator,
            devices_per_host=spg.chips_per_host)
        for i in range(spg.num_hosts)
    ]
    want = sum(range(1, spg.num_hosts * spg.chips_per_host + 1))
    ok = True
    for rank, host, devices, total in ray.get(tasks, timeout=600):
        good = total == want
        ok = ok and good
        print(f"rank {rank} on {host}: psum over {devices} devices = {total} "
              f"(expected {want}) {'OK' if good else 'MISMATCH'}", flush=True)
    spg.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
