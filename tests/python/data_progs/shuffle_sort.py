"""Reordering and reblocking (Ray Data docs "Shuffling data", "Transforming data" > repartition,
"Performance tips"; API repartition, random_shuffle, randomize_block_order, sort):
repartition(n) gives n blocks with every row; random_shuffle gives a permutation of the rows,
the same one for the same seed and another for another seed or none; randomize_block_order
reorders whole blocks (rows stay together inside a block); sort orders by one key ascending or
descending and by several keys with a direction each."""
import random

import ray
from ray.data import DataContext

N = 1000


def ids(ds):
    return [r["id"] for r in ds.take_all()]


def check_repartition():
    ds = ray.data.range(N, override_num_blocks=3)
    for n in (1, 7, 20):
        m = ds.repartition(n).materialize()
        assert m.num_blocks() == n, (n, m.num_blocks())
        assert sorted(ids(m)) == list(range(N))
    shuffled = ds.repartition(5, shuffle=True).materialize()
    assert shuffled.num_blocks() == 5 and sorted(ids(shuffled)) == list(range(N))


def check_random_shuffle():
    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True  # compare whole orders run to run
    ds = ray.data.range(N, override_num_blocks=8)
    a = ids(ds.random_shuffle(seed=7))
    b = ids(ds.random_shuffle(seed=7))
    c = ids(ds.random_shuffle(seed=8))
    d = ids(ds.random_shuffle())
    assert all(sorted(x) == list(range(N)) for x in (a, c, d))
    assert a == b, "the same seed gave two orders"
    assert a != c and a != d and a != list(range(N)), "a shuffle left the order as it was"
    ctx.execution_options.preserve_order = False


def check_randomize_block_order():
    ds = ray.data.range(N, override_num_blocks=10)
    out = ids(ds.randomize_block_order(seed=3))
    assert sorted(out) == list(range(N))
    # Rows of a block stay together: 10 ascending runs of 100 consecutive ids.
    runs = [out[i:i + 100] for i in range(0, N, 100)]
    assert all(run == list(range(run[0], run[0] + 100)) for run in runs), [r[0] for r in runs]
    assert all(run[0] % 100 == 0 for run in runs)


def check_sort():
    ds = ray.data.range(N, override_num_blocks=6).random_shuffle(seed=1)
    assert ids(ds.sort("id")) == list(range(N))
    assert ids(ds.sort("id", descending=True)) == list(range(N - 1, -1, -1))
    rng = random.Random(5)
    items = [{"a": rng.randrange(5), "b": rng.randrange(100), "i": i} for i in range(300)]
    multi = ray.data.from_items(items, override_num_blocks=4).sort(["a", "b"],
                                                                   descending=[False, True])
    got = [(r["a"], r["b"]) for r in multi.take_all()]
    assert got == sorted(((x["a"], x["b"]) for x in items), key=lambda t: (t[0], -t[1])), got[:10]
    top = ray.data.from_items(items).sort("b", descending=True).take(3)
    assert [r["b"] for r in top] == sorted((x["b"] for x in items), reverse=True)[:3]


def main():
    ray.init(num_cpus=4)
    check_repartition()
    check_random_shuffle()
    check_randomize_block_order()
    check_sort()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
