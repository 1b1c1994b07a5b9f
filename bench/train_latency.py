"""How long JaxTrainer takes to start a group, and to restart it after a worker is SIGKILLed.

Runs against whatever `import ray` is: Torus under `python -m torus.ray`, or real Ray 2.60
(RAY_TRAIN_V2_ENABLED=1 is set here). Each round: fit() of a loop that stamps its start time on
every rank; on the first attempt rank 2 stamps a kill time and SIGKILLs its own process; the
second attempt stamps again and returns. Prints one JSON line per round and the medians:

  start_s    fit() called -> the last rank's loop running (reservation, actors, setup)
  restart_s  the kill -> the last rank's loop running again (failure noticed, group torn down,
             resources reserved again, new actors, setup)

  python -m torus.ray bench/train_latency.py [--rounds 5] [--tpu]        # Torus
  RAY_ADDRESS=... python bench/train_latency.py [--rounds 5]             # Ray (--tpu needs TPUs)
"""
import argparse
import json
import os
import signal
import statistics
import tempfile
import time

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")


def loop(config):
    from ray import train
    d = config["dir"]
    rank = train.get_context().get_world_rank()
    attempt = 1 if os.path.exists(os.path.join(d, "killed")) else 0
    with open(os.path.join(d, f"start-{attempt}-{rank}"), "w") as f:
        f.write(repr(time.time()))
    if attempt == 0:
        if rank == 2:
            time.sleep(1.0)  # every rank is up before the kill
            with open(os.path.join(d, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)


def one_round(tpu: bool):
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    try:
        from ray.train.v2.jax import JaxTrainer
    except ImportError:
        from ray.train.jax import JaxTrainer
    d = tempfile.mkdtemp(prefix="train-latency-")
    sc = (ScalingConfig(use_tpu=True, topology="4x4", accelerator_type="TPU-V6E", num_workers=4)
          if tpu else ScalingConfig(num_workers=4, resources_per_worker={"CPU": 1}))
    trainer = JaxTrainer(loop, train_loop_config={"dir": d}, scaling_config=sc,
                         run_config=RunConfig(name="latency", storage_path=d,
                                              failure_config=FailureConfig(max_failures=1)))
    t0 = time.time()
    trainer.fit()
    read = lambda n: float(open(os.path.join(d, n)).read())  # noqa: E731
    start = max(read(f"start-0-{r}") for r in range(4)) - t0
    restart = max(read(f"start-1-{r}") for r in range(4)) - read("killed")
    return {"start_s": round(start, 3), "restart_s": round(restart, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tpu", action="store_true", help="a whole v6e 4x4 slice (torus up)")
    a = ap.parse_args()
    import ray
    ray.init()
    rows = []
    for _ in range(a.rounds):
        rows.append(one_round(a.tpu))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"median_start_s": statistics.median(r["start_s"] for r in rows),
                      "median_restart_s": statistics.median(r["restart_s"] for r in rows),
                      "rounds": a.rounds, "tpu": a.tpu}))


if __name__ == "__main__":
    main()
