"""Stateful transforms in actor pools (Ray Data docs "Transforming data" > stateful transforms;
"Execution configurations"; API map_batches `concurrency`, ActorPoolStrategy): a callable class
is constructed once per actor with fn_constructor_args/fn_constructor_kwargs and keeps its
state across the batches it serves; concurrency=2 runs exactly two actors; concurrency=(1, 3)
runs between one and three (more than one when the work is slow and plentiful), as does
compute=ActorPoolStrategy(min_size=1, max_size=3); compute=ActorPoolStrategy(size=2) makes
two; map, filter and flat_map take callable classes too; concurrency=N on a function bounds
the tasks running at once to N."""
import os
import time
import uuid

import numpy as np

import ray


class Offset:
    def __init__(self, offset, *, scale=1, delay=0.0):
        self.offset, self.scale, self.delay = offset, scale, delay
        self.name = uuid.uuid4().hex
        self.calls = 0
        ray.get(ray.get_actor("registry").add.remote(self.name))

    def __call__(self, batch):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        n = len(batch["id"])
        return {"id": batch["id"] * self.scale + self.offset,
                "actor": np.array([self.name] * n), "call": np.full(n, self.calls),
                "pid": np.full(n, os.getpid())}


def actors_used(rows):
    calls = {}
    for r in rows:
        calls.setdefault(r["actor"], set()).add(r["call"])
    # State persists in an actor: its calls were numbered 1, 2, ... with no restart.
    for name, seen in calls.items():
        assert seen == set(range(1, len(seen) + 1)), (name, sorted(seen))
    return calls


@ray.remote
class Registry:
    """The actors a pool constructed (each registers from its constructor)."""

    def __init__(self):
        self.names = []

    def add(self, name):
        self.names.append(name)

    def take(self):
        names, self.names = self.names, []
        return names


def check_fixed_pool(registry):
    ds = ray.data.range(400, override_num_blocks=20)
    rows = ds.map_batches(Offset, fn_constructor_args=(1000,),
                          fn_constructor_kwargs={"scale": 2, "delay": 0.05},
                          concurrency=2, batch_size=20).take_all()
    assert sorted(r["id"] for r in rows) == [1000 + 2 * i for i in range(400)]
    made = ray.get(registry.take.remote())
    used = actors_used(rows)
    assert len(made) == 2 and set(used) <= set(made), (len(made), len(used))
    assert len({r["pid"] for r in rows}) == len(used)
    old = ds.map_batches(Offset, fn_constructor_args=(0,),
                         compute=ray.data.ActorPoolStrategy(size=2)).take_all()
    assert sorted(r["id"] for r in old) == list(range(400))
    made = ray.get(registry.take.remote())
    assert len(made) == 2 and set(actors_used(old)) <= set(made), made


def check_autoscaling_pool(registry):
    ds = ray.data.range(480, override_num_blocks=24)
    for how in ({"concurrency": (1, 3)},
                {"compute": ray.data.ActorPoolStrategy(min_size=1, max_size=3)}):
        rows = ds.map_batches(Offset, fn_constructor_args=(0,),
                              fn_constructor_kwargs={"delay": 0.3}, batch_size=20,
                              **how).take_all()
        assert sorted(r["id"] for r in rows) == list(range(480))
        used, made = actors_used(rows), ray.get(registry.take.remote())
        print("autoscaling pool", list(how)[0], "made", len(made), "used", len(used), "actors")
        assert 1 < len(used) <= len(made) <= 3, (len(used), len(made))


class Keep:
    def __init__(self, mod):
        self.mod = mod

    def __call__(self, row):
        return row["id"] % self.mod == 0


class Twice:
    def __call__(self, row):
        return [{"id": row["id"]}, {"id": -row["id"]}]


class Square:
    def __call__(self, row):
        return {"id": row["id"], "sq": row["id"] ** 2}


def check_row_classes():
    ds = ray.data.range(30)
    sq = ds.map(Square, concurrency=2).take_all()
    assert sorted((r["id"], r["sq"]) for r in sq) == [(i, i * i) for i in range(30)]
    kept = ds.filter(Keep, fn_constructor_args=(3,), concurrency=1).take_all()
    assert sorted(r["id"] for r in kept) == list(range(0, 30, 3))
    flat = ds.flat_map(Twice, concurrency=(1, 2)).take_all()
    assert sorted(r["id"] for r in flat) == sorted(list(range(30)) + [-i for i in range(30)])


@ray.remote
class Gauge:
    def __init__(self):
        self.now = self.peak = 0

    def enter(self):
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self):
        self.now -= 1

    def get_peak(self):
        return self.peak


def check_task_concurrency():
    gauge = Gauge.remote()

    def slow(batch):
        ray.get(gauge.enter.remote())
        time.sleep(0.2)
        ray.get(gauge.leave.remote())
        return batch

    out = ray.data.range(120, override_num_blocks=12).map_batches(slow, concurrency=2)
    assert out.count() == 120
    peak = ray.get(gauge.get_peak.remote())
    assert 1 <= peak <= 2, peak


def main():
    ray.init(num_cpus=6)
    registry = Registry.options(name="registry").remote()
    check_fixed_pool(registry)
    check_autoscaling_pool(registry)
    check_row_classes()
    check_task_concurrency()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
