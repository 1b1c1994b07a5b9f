"""All-reduce over every device of a gang-launched Torus job (docs/jobs.md).

Run once per host of a slice by `torus job submit --slice 4x4 --accelerator v6e -- ...`; each
process reads its rank, the process count and the coordinator from the TORUS_* variables Torus
sets, joins jax.distributed, and takes part in one psum over a mesh of all devices of all
processes. On these simulated slices the devices are CPU devices (DEVICES_PER_PROCESS per
process, via XLA's host-platform device count) and the collectives go over gloo.

Process p holds the values p*d+1 .. p*d+d on its d devices, so the sum over D = n*d devices is
D*(D+1)/2 on every process; the program checks that exact value and exits 1 otherwise.
"""
import os
import sys

DEVICES_PER_PROCESS = int(os.environ.get("DEVICES_PER_PROCESS", "2"))
# Before jax is imported: the CPU platform reads the flag once.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_force_host_platform_device_count={DEVICES_PER_PROCESS}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.shard_map import shard_map  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def main() -> int:
    rank = int(os.environ["TORUS_PROCESS_ID"])
    nproc = int(os.environ["TORUS_NUM_PROCESSES"])
    coordinator = os.environ["TORUS_COORDINATOR_ADDRESS"]
    host = f"{os.environ.get('TPU_NAME', '?')}/{os.environ.get('TPU_WORKER_ID', '?')}"

    # Multi-process collectives on CPU need an implementation; jax 0.4.38 has gloo built in.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=nproc,
                               process_id=rank, initialization_timeout=120)

    devices = jax.devices()  # every device of every process
    total = len(devices)
    if total != nproc * DEVICES_PER_PROCESS or jax.process_count() != nproc:
        print(f"rank {rank}: expected {nproc}x{DEVICES_PER_PROCESS} devices, JAX sees {total} "
              f"in {jax.process_count()} processes", flush=True)
        return 1
    mesh = Mesh(np.array(devices), ("x",))
    local = np.array([[rank * DEVICES_PER_PROCESS + j + 1] for j in range(DEVICES_PER_PROCESS)],
                     dtype=np.int32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local, (total, 1))
    allreduce = jax.jit(shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh,
                                  in_specs=P("x"), out_specs=P()))
    got = int(np.asarray(allreduce(x).addressable_data(0)).reshape(-1)[0])
    want = total * (total + 1) // 2
    ok = got == want
    print(f"rank {rank}/{nproc} on {host}: psum over {total} devices = {got} "
          f"(expected {want}) {'OK' if ok else 'MISMATCH'}", flush=True)
    jax.distributed.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
