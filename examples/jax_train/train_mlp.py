"""Data-parallel training of a small MLP with JAX on a whole TPU slice, through JaxTrainer.

Each of the slice's hosts runs `train_loop` in one worker; the workers join one JAX program
(jax.distributed: coordinator on rank 0's host, from JAX_COORDINATOR_ADDRESS), every host holds
its rows of each global batch, and `jax.jit` of the gradient step all-reduces the gradients over
every device of every host. Rank 0 checkpoints the parameters every CHECKPOINT_EVERY steps; a
restarted group resumes from the latest checkpoint.

On the simulated slices of `torus up` the "chips" are CPU devices (DEVICES_PER_HOST per process,
XLA's host platform) and the collectives go over gloo. Written against Ray's API:

    python -m torus.ray examples/jax_train/train_mlp.py [--storage DIR] [--name NAME] [--steps N]
    python examples/jax_train/train_mlp.py --single      # the same steps in one process
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

FEATURES, HIDDEN = 16, 32
GLOBAL_BATCH = 256          # rows per step, over all hosts
LEARNING_RATE = 0.05


def make_batch(step: int):
    """The global batch of step `step`, the same on every host (and in the reference run)."""
    w_true = np.random.default_rng(12345).normal(size=(FEATURES, 1)).astype(np.float32)
    rng = np.random.default_rng(step)
    x = rng.normal(size=(GLOBAL_BATCH, FEATURES)).astype(np.float32)
    y = np.tanh(x @ w_true) + 0.1 * rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)
    return x, y.astype(np.float32)


def init_params():
    rng = np.random.default_rng(1)
    return {"w1": (rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
            "b1": np.zeros((HIDDEN,), np.float32),
            "w2": (rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
            "b2": np.zeros((1,), np.float32)}


def setup_jax(devices: int, multi_process: bool):
    # Before jax is imported in this process: CPU devices standing in for the host's chips.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={devices}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    if multi_process:  # collectives between CPU processes
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    return jax


def make_step(jax):
    import jax.numpy as jnp

    def loss_fn(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, b: a - LEARNING_RATE * b, p, g), loss
    return step


def train_loop(config):
    import ray.train as train
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    jax = setup_jax(config["devices_per_host"], world > 1)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    if world > 1:
        # On simulated hosts (CPU JAX) the loop joins the group itself; the coordinator comes
        # from JAX_COORDINATOR_ADDRESS. On TPU hosts the trainer already did (as Ray does).
        try:
            jax.distributed.initialize(num_processes=world, process_id=rank,
                                       initialization_timeout=120)
        except RuntimeError as e:
            if "only be called once" not in str(e):
                raise
    if config.get("pid_dir"):
        with open(os.path.join(config["pid_dir"], f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    steps = config["steps"]
    per = GLOBAL_BATCH // world

    params, start = init_params(), 0
    ckpt = train.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            saved = np.load(os.path.join(d, "params.npz"))
            params = {k: saved[k] for k in params}
            start = int(json.load(open(os.path.join(d, "step.json")))["step"]) + 1
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i])
              for k, v in params.items()}
    step = make_step(jax)
    for s in range(start, steps):
        xb, yb = make_batch(s)
        x = jax.make_array_from_process_local_data(rows, xb[rank * per:(rank + 1) * per])
        y = jax.make_array_from_process_local_data(rows, yb[rank * per:(rank + 1) * per])
        params, loss = step(params, x, y)
        metrics = {"step": s, "loss": float(loss.addressable_data(0)),
                   "devices": jax.device_count()}
        if (s + 1) % config["checkpoint_every"] == 0 or s == steps - 1:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    np.savez(os.path.join(d, "params.npz"),
                             **{k: np.asarray(v.addressable_data(0)) for k, v in params.items()})
                    json.dump({"step": s}, open(os.path.join(d, "step.json"), "w"))
                    train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
                else:
                    train.report(metrics)
        else:
            train.report(metrics)
        time.sleep(config.get("step_sleep", 0.0))


def single_process(steps: int, devices: int):
    """The same steps in one process (the reference the distributed run must match)."""
    jax = setup_jax(devices, False)
    params, step, losses = init_params(), make_step(jax), []
    for s in range(steps):
        params, loss = step(params, *make_batch(s))
        losses.append(float(loss))
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--devices-per-host", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--storage", default=os.path.join(tempfile.gettempdir(), "torus-train"))
    ap.add_argument("--name", default="mlp")
    ap.add_argument("--max-failures", type=int, default=2)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--pid-dir", default="")
    ap.add_argument("--num-to-keep", type=int, default=2)
    a = ap.parse_args()
    if a.single:
        losses = single_process(a.steps, a.devices_per_host * 4)
        print("SINGLE", json.dumps(losses))
        return 0
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.jax import JaxTrainer
    ray.init()
    trainer = JaxTrainer(
        train_loop,
        train_loop_config={"steps": a.steps, "devices_per_host": a.devices_per_host,
                           "checkpoint_every": a.checkpoint_every, "pid_dir": a.pid_dir,
                           "step_sleep": a.step_sleep},
        scaling_config=ScalingConfig(use_tpu=True, topology="4x4", accelerator_type="TPU-V6E",
                                     num_workers=4),
        run_config=RunConfig(name=a.name, storage_path=a.storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=a.num_to_keep),
                             failure_config=FailureConfig(max_failures=a.max_failures)))
    result = trainer.fit()
    print("RESULT", json.dumps({"metrics": result.metrics, "checkpoint": result.checkpoint.path,
                                "path": result.path}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
