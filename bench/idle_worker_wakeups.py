"""How often an idle Python actor's worker wakes up: the voluntary context switches of all its
threads over a few seconds, on a private local cluster.

    .venv-py/bin/python bench/idle_worker_wakeups.py [--seconds S]     # Torus
    .venv-py/bin/python -m torus.ray bench/idle_worker_wakeups.py      # the same, as a Ray program
"""
import argparse
import glob
import os
import time

try:
    import torus as ray
except ImportError:  # run under real Ray
    import ray


def switches(pid):
    total = 0
    for st in glob.glob(f"/proc/{pid}/task/*/status"):
        with open(st) as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


@ray.remote
class Idle:
    def pid(self):
        return os.getpid()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    seconds = ap.parse_args().seconds
    ray.init(num_cpus=1)
    a = Idle.remote()
    pid = ray.get(a.pid.remote())
    time.sleep(1)
    before = switches(pid)
    time.sleep(seconds)
    after = switches(pid)
    print(f"idle actor worker: {(after - before) / seconds:.1f} wake-ups/s over all its threads")
    ray.shutdown()


if __name__ == "__main__":
    main()
