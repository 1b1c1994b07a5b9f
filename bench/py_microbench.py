"""Ray's `ray microbenchmark` rows as one Ray program, run unchanged on both runtimes:

    python bench/py_microbench.py [--seconds S] [--only NAME,...]           # on Ray
    python -m torus.ray bench/py_microbench.py [--seconds S] [--only ...]    # on Torus

Each row runs its operation in a loop for about S seconds (after one warm-up round) and prints one
JSON line {"name", "value", "unit"} with the rate, like Ray's rows of the same names
(ray/_private/ray_perf.py). Besides those: the time from init() to the first task's result
("first_result_s"), and the resident memory of one idle Python worker ("idle_worker_rss_mb").
Connects to RAY_ADDRESS / TORUS_ADDRESS when set, else starts a private cluster.
"""
import argparse
import json
import os
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402


def emit(name, value, unit):
    print(json.dumps({"name": name, "value": value, "unit": unit}), flush=True)


def timeit(name, fn, seconds, multiplier=1, unit="ops/s"):
    fn()  # warm-up
    n = 0
    start = time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    emit(name, n * multiplier / elapsed, unit)


@ray.remote
def small_value():
    return b"ok"


@ray.remote
def getpid():
    return os.getpid()


@ray.remote(num_cpus=0)
class Actor:
    def small_value(self):
        return b"ok"

    def small_value_batch(self, n):
        ray.get([small_value.remote() for _ in range(n)])

    def pid(self):
        return os.getpid()


@ray.remote(num_cpus=0)
class Client:
    def __init__(self, servers):
        self.servers = servers if isinstance(servers, list) else [servers]

    def small_value_batch(self, n):
        refs = []
        for s in self.servers:
            refs.extend([s.small_value.remote() for _ in range(n)])
        ray.get(refs)


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda name: not only or name in only  # noqa: E731
    s = args.seconds

    ray.init()
    first = ray.get(small_value.remote())
    assert first == b"ok"
    emit("first_result_s", time.perf_counter() - T_START, "s")

    if want("idle_worker_rss_mb"):
        pid = ray.get(getpid.remote())
        time.sleep(1.0)
        emit("idle_worker_rss_mb", rss_mb(pid), "MB")

    value = ray.put(0)
    if want("single_client_get_calls"):
        timeit("single_client_get_calls", lambda: ray.get(value), s)
    if want("single_client_put_calls"):
        timeit("single_client_put_calls", lambda: ray.put(0), s)
    if want("single_client_put_gigabytes"):
        arr = np.zeros(100 * 1024 * 1024 // 8, dtype=np.int64)  # 100 MiB
        timeit("single_client_put_gigabytes", lambda: ray.put(arr), s,
               multiplier=arr.nbytes / 1e9, unit="GB/s")
    if want("single_client_get_gigabytes"):
        ref = ray.put(np.zeros(100 * 1024 * 1024 // 8, dtype=np.int64))
        timeit("single_client_get_gigabytes", lambda: ray.get(ref), s,
               multiplier=100 * 1024 * 1024 / 1e9, unit="GB/s")
    if want("single_client_tasks_sync"):
        timeit("single_client_tasks_sync", lambda: ray.get(small_value.remote()), s)
    if want("single_client_tasks_async"):
        timeit("single_client_tasks_async",
               lambda: ray.get([small_value.remote() for _ in range(1000)]), s, multiplier=1000)
    if want("single_client_wait_1k_refs"):
        def wait_1k():
            refs = [small_value.remote() for _ in range(1000)]
            ray.wait(refs, num_returns=len(refs))
        timeit("single_client_wait_1k_refs", wait_1k, s)
    if want("multi_client_tasks_async"):
        n = 4
        clients = [Actor.remote() for _ in range(n)]
        ray.get([c.small_value.remote() for c in clients])
        timeit("multi_client_tasks_async",
               lambda: ray.get([c.small_value_batch.remote(250) for c in clients]), s,
               multiplier=n * 250)
        for c in clients:
            ray.kill(c)
    a = Actor.remote()
    ray.get(a.small_value.remote())
    if want("1_1_actor_calls_sync"):
        timeit("1_1_actor_calls_sync", lambda: ray.get(a.small_value.remote()), s)
    if want("1_1_actor_calls_async"):
        timeit("1_1_actor_calls_async",
               lambda: ray.get([a.small_value.remote() for _ in range(1000)]), s, multiplier=1000)
    if want("1_1_actor_calls_concurrent"):
        c = Actor.options(max_concurrency=16).remote()
        ray.get(c.small_value.remote())
        timeit("1_1_actor_calls_concurrent",
               lambda: ray.get([c.small_value.remote() for _ in range(1000)]), s, multiplier=1000)
        ray.kill(c)
    if want("1_n_actor_calls_async"):
        n = 4
        servers = [Actor.remote() for _ in range(n)]
        ray.get([x.small_value.remote() for x in servers])
        client = Client.remote(servers)
        timeit("1_n_actor_calls_async", lambda: ray.get(client.small_value_batch.remote(250)), s,
               multiplier=n * 250)
        for x in servers:
            ray.kill(x)
    if want("placement_group_create/removal"):
        def pg_cycle():
            pgs = [placement_group([{"CPU": 0.001}]) for _ in range(10)]
            ray.get([pg.ready() for pg in pgs])
            for pg in pgs:
                remove_placement_group(pg)
        timeit("placement_group_create/removal", pg_cycle, s, multiplier=10)
    ray.shutdown()


if __name__ == "__main__":
    main()
