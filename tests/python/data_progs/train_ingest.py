"""Training ingest (Ray Train docs "Data loading and preprocessing" / "Data for Ray Train"; API
JaxTrainer(datasets=...), ray.train.get_dataset_shard, DataConfig): JaxTrainer with
datasets={"train": ds, "val": val} and two workers: in the training loop each worker's
get_dataset_shard("train").iter_batches(...) yields its own shard; in every epoch the shards are
disjoint, of equal size, and together the whole dataset; a dataset DataConfig leaves unsplit
(datasets_to_split=["train"]) reaches every worker whole; with random_shuffle() in the pipeline
each epoch comes in a fresh order."""
import json
import os
import tempfile

import numpy as np

import ray
import ray.train
from ray.train import DataConfig, RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer

N, VAL, EPOCHS, WORKERS = 1000, 64, 3, 2


def train_fn(config):
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    shard = ray.train.get_dataset_shard("train")
    val = ray.train.get_dataset_shard("val")
    record = {"epochs": [], "val": []}
    for epoch in range(EPOCHS):
        ids = []
        for batch in shard.iter_batches(batch_size=32):
            assert np.allclose(batch["x"], batch["id"] * 2.0)
            ids.extend(batch["id"].tolist())
        record["epochs"].append(ids)
        record["val"].append(sorted(r["id"] for r in val.iter_rows()))
        ray.train.report({"epoch": epoch, "rows": len(ids)})
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def run(out, train_ds, name):
    trainer = JaxTrainer(
        train_fn, train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=WORKERS),
        datasets={"train": train_ds, "val": ray.data.range(VAL)},
        dataset_config=DataConfig(datasets_to_split=["train"]),
        run_config=RunConfig(name=name, storage_path=os.path.join(out, "storage")))
    result = trainer.fit()
    assert result.error is None, result.error
    records = []
    for rank in range(WORKERS):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            records.append(json.load(f))
    for epoch in range(EPOCHS):
        shards = [r["epochs"][epoch] for r in records]
        flat = [i for s in shards for i in s]
        assert sorted(flat) == list(range(N)), f"epoch {epoch}: not the whole dataset once"
        assert [len(s) for s in shards] == [N // WORKERS] * WORKERS, [len(s) for s in shards]
        for r in records:
            assert r["val"][epoch] == list(range(VAL)), "val was split"
    print(name, "shard sizes", [len(s) for s in shards])
    return records


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as out:
        ds = ray.data.range(N, override_num_blocks=10).map_batches(
            lambda b: {"id": b["id"], "x": b["id"] * 2.0})
        run(out, ds, "plain")
        shuffled = run(out, ds.random_shuffle(), "shuffled")
        orders = [[i for r in shuffled for i in r["epochs"][e]] for e in range(EPOCHS)]
        assert len({tuple(o) for o in orders}) == EPOCHS, "two epochs came in the same order"
        assert all(o != sorted(o) for o in orders)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
