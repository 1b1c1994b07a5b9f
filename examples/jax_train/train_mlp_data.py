"""The JaxTrainer MLP of train_mlp.py fed by Ray Data from Parquet files, on a whole TPU slice.

1. A Ray Data pipeline writes the training set as Parquet files (range -> map_batches ->
   write_parquet): FEATURES float32 inputs and a noisy tanh target per row.
2. `read_parquet -> map_batches(standardize)` is handed to `JaxTrainer(datasets={"train": ds})`.
   Each host of the slice reads its own disjoint shard of every epoch through
   `ray.train.get_dataset_shard("train").iter_batches(...)` (equal rows per host, so every host
   runs the same number of steps and no collective waits), assembles its rows of each global
   batch into a sharded jax.Array, and the jitted step all-reduces the gradients.
3. Rank 0 reports the loss per epoch; the run fails unless the loss went down.

    python -m torus.ray examples/jax_train/train_mlp_data.py [--rows N] [--epochs E] [--storage DIR]
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def make_rows(batch):
    """map_batches: ids -> (x, y) rows of the synthetic regression task (deterministic per id)."""
    sys.path.insert(0, HERE)
    import train_mlp as m
    ids = batch["id"]
    w_true = np.random.default_rng(12345).normal(size=(m.FEATURES, 1)).astype(np.float32)
    x = np.stack([np.random.default_rng(int(i)).normal(size=m.FEATURES) for i in ids]).astype(np.float32)
    y = (np.tanh(x @ w_true)[:, 0] + 0.1 * np.random.default_rng(int(ids[0])).normal(size=len(ids))).astype(np.float32)
    return {"x": x, "y": y}


def standardize(batch):
    return {"x": np.clip(batch["x"], -4.0, 4.0), "y": batch["y"]}


def train_loop(config):
    sys.path.insert(0, config["here"])
    import ray.train as train
    import train_mlp as m
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    jax = m.setup_jax(config["devices_per_host"], world > 1)
    if world > 1:
        try:
            jax.distributed.initialize(num_processes=world, process_id=rank,
                                       initialization_timeout=120)
        except RuntimeError as e:
            if "only be called once" not in str(e):
                raise
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i])
              for k, v in m.init_params().items()}
    step = m.make_step(jax)
    shard = train.get_dataset_shard("train")
    per_host = m.GLOBAL_BATCH // world
    for epoch in range(config["epochs"]):
        losses, n_rows = [], 0
        for b in shard.iter_batches(batch_size=per_host, drop_last=True, batch_format="numpy"):
            x = jax.make_array_from_process_local_data(rows, b["x"])
            y = jax.make_array_from_process_local_data(rows, b["y"][:, None])
            params, loss = step(params, x, y)
            losses.append(float(loss.addressable_data(0)))
            n_rows += len(b["y"])
        metrics = {"epoch": epoch, "loss": float(np.mean(losses)), "steps": len(losses),
                   "rows_this_host": n_rows, "devices": jax.device_count()}
        if rank == 0:
            with open(config["loss_file"], "a") as f:
                f.write(json.dumps(metrics) + "\n")
        train.report(metrics)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--devices-per-host", type=int, default=2)
    ap.add_argument("--storage", default=os.path.join(tempfile.gettempdir(), "torus-train-data"))
    a = ap.parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.jax import JaxTrainer
    ray.init()
    data_dir = os.path.join(a.storage, "parquet")
    ray.data.range(a.rows, override_num_blocks=8).map_batches(make_rows).write_parquet(data_dir)
    ds = ray.data.read_parquet(data_dir).map_batches(standardize)
    print(f"DATA {len(os.listdir(data_dir))} Parquet files, {ds.count()} rows, "
          f"schema {ds.schema().names}", flush=True)
    loss_file = os.path.join(a.storage, "epochs.jsonl")
    if os.path.exists(loss_file):
        os.remove(loss_file)
    trainer = JaxTrainer(
        train_loop,
        train_loop_config={"epochs": a.epochs, "devices_per_host": a.devices_per_host,
                           "here": HERE, "loss_file": loss_file},
        scaling_config=ScalingConfig(use_tpu=True, topology="4x4", accelerator_type="TPU-V6E",
                                     num_workers=4),
        run_config=RunConfig(name="mlp-data", storage_path=a.storage),
        datasets={"train": ds})
    result = trainer.fit()
    epochs = [json.loads(line) for line in open(loss_file)]
    losses = [e["loss"] for e in epochs]
    print("EPOCHS", json.dumps(epochs))
    print("RESULT", json.dumps({"path": result.path, "epoch_losses": losses}))
    if len(losses) >= 2 and not losses[-1] < losses[0]:
        print("the loss did not go down", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
