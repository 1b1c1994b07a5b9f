"""Training ingest on a TPU slice (issue #43 item 3; Ray Train docs "Data loading and
preprocessing", API JaxTrainer(datasets=...), DataIterator.iter_jax_batches): on a cluster with
one v6e 4x4 slice (4 hosts, run by test_data.py through `torus up`), JaxTrainer with
use_tpu=True and four workers, one per host; each host's get_dataset_shard("train") streams its
own shard: through iter_jax_batches the global jax.Arrays span every device of the group (a 1-D
mesh), each host's addressable rows are its own and disjoint from the others', all hosts yield
the same number of batches in an epoch, and the hosts together cover the dataset in each of
two epochs; iter_batches on the same shard does the same; the data tasks hold no TPU chip.
Needs TPU hosts: Ray 2.60 cannot run it here."""
import json
import os
import tempfile

import numpy as np

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer

N, HOSTS, PER_HOST_BATCH, EPOCHS = 648, 4, 8, 2


def data_task(batch):
    """A data task records the TPU chips it holds: none (the hosts' chips are the trainer's)."""
    tpu = ray.get_runtime_context().get_assigned_resources().get("TPU", 0)
    return {"id": batch["id"], "tpu": np.full(len(batch["id"]), tpu)}


def setup_jax(rank: int, world: int):
    """On a real TPU host the trainer has joined the JAX group already (as Ray does); on the
    simulated hosts here CPU JAX stands in for each host's chips (two devices) and the loop
    joins the group itself, from JAX_COORDINATOR_ADDRESS (examples/jax_train/train_mlp.py)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(num_processes=world, process_id=rank,
                                   initialization_timeout=120)
    except RuntimeError as e:
        if "only be called once" not in str(e):
            raise
    return jax


def loop(config):
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    jax = setup_jax(rank, ctx.get_world_size())
    shard = ray.train.get_dataset_shard("train")
    rec = {"devices": jax.device_count(), "local_devices": jax.local_device_count(),
           "processes": jax.process_count(), "epochs": [], "global_rows": []}
    for _ in range(EPOCHS):
        local, batches = [], 0
        for batch in shard.iter_jax_batches(batch_size=PER_HOST_BATCH):
            arr = batch["id"]
            assert isinstance(arr, jax.Array) and len(arr.sharding.device_set) == jax.device_count()
            rec["global_rows"].append(int(arr.shape[0]))
            for s in arr.addressable_shards:
                local.extend(np.asarray(s.data).reshape(-1).tolist())
            batches += 1
        rec["epochs"].append({"ids": local, "batches": batches})
    rec["plain"], rec["data_tpus"] = [], set()
    for b in shard.iter_batches(batch_size=16):
        rec["plain"].extend(b["id"].tolist())
        rec["data_tpus"].update(b["tpu"].tolist())
    rec["data_tpus"] = sorted(rec["data_tpus"])
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)


def main():
    ray.init()
    with tempfile.TemporaryDirectory() as out:
        os.chmod(out, 0o777)
        ds = ray.data.range(N, override_num_blocks=12).map_batches(data_task)
        sc = ScalingConfig(use_tpu=True, topology="4x4", accelerator_type="TPU-V6E",
                           num_workers=HOSTS)
        result = JaxTrainer(loop, train_loop_config={"out": out}, scaling_config=sc,
                            datasets={"train": ds},
                            run_config=RunConfig(name="slice-ingest",
                                                 storage_path=os.path.join(out, "st"))).fit()
        assert result.error is None, result.error
        recs = []
        for r in range(HOSTS):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                recs.append(json.load(f))
    assert {(r["devices"], r["processes"]) for r in recs} == {(HOSTS * recs[0]["local_devices"],
                                                                HOSTS)}, recs[0]
    for e in range(EPOCHS):
        shards = [r["epochs"][e]["ids"] for r in recs]
        flat = [i for s in shards for i in s]
        assert len(flat) == len(set(flat)), f"epoch {e}: a row reached two hosts"
        assert set(flat) <= set(range(N)) and len(flat) > N - HOSTS, (e, len(flat))
        assert len({r["epochs"][e]["batches"] for r in recs}) == 1, \
            [r["epochs"][e]["batches"] for r in recs]
        print(f"epoch {e}: rows per host {[len(s) for s in shards]}, batches per host "
              f"{recs[0]['epochs'][e]['batches']}")
    assert max(recs[0]["global_rows"]) == PER_HOST_BATCH * HOSTS, recs[0]["global_rows"]
    plain = [i for r in recs for i in r["plain"]]
    assert all(r["data_tpus"] == [0] for r in recs), [r["data_tpus"] for r in recs]
    assert len(plain) == len(set(plain)) and len(plain) > N - HOSTS
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
