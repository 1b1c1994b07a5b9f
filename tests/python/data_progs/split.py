"""Splitting a dataset (Ray Data docs "Iterating over data" > splitting datasets for parallel
training; API split, split_at_indices, split_proportionately, train_test_split): split(n) gives
n disjoint materialized pieces that together hold every row, of equal sizes with equal=True, and
that Ray actors can consume; split_at_indices cuts at row positions, keeping row order;
split_proportionately cuts by fractions; train_test_split sizes its halves by a fraction or a
row count, takes the last rows as the test set unless shuffle=True, and a seed makes the shuffled
split repeatable."""
import ray

N = 1000


def ids(ds):
    return [r["id"] for r in ds.take_all()]


@ray.remote
class Worker:
    def consume(self, shard):
        return [i for b in shard.iter_batches(batch_size=16) for i in b["id"].tolist()]


def check_split():
    ds = ray.data.range(N, override_num_blocks=10)
    parts = ds.split(3)
    assert len(parts) == 3
    got = [ids(p) for p in parts]
    assert sorted(i for g in got for i in g) == list(range(N))
    assert all(p.count() > 0 for p in parts)
    equal = ray.data.range(1001, override_num_blocks=4).split(4, equal=True)
    sizes = [p.count() for p in equal]
    assert sizes == [250] * 4, sizes  # equal=True may drop the remainder
    flat = [i for p in equal for i in ids(p)]
    assert len(set(flat)) == 1000 and set(flat) <= set(range(1001))
    workers = [Worker.remote() for _ in range(4)]
    shards = ray.data.range(N).split(n=4, equal=True)
    seen = ray.get([w.consume.remote(s) for w, s in zip(workers, shards)])
    assert sorted(i for s in seen for i in s) == list(range(N))
    assert [len(s) for s in seen] == [250] * 4


def check_split_at_indices():
    ds = ray.data.range(N, override_num_blocks=6)
    a, b, c = ds.split_at_indices([100, 400])
    assert ids(a) == list(range(100)), ids(a)[:5]
    assert ids(b) == list(range(100, 400))
    assert ids(c) == list(range(400, N))
    p1, p2, p3 = ds.split_proportionately([0.2, 0.5])
    assert (p1.count(), p2.count(), p3.count()) == (200, 500, 300)
    assert ids(p1) == list(range(200))


def check_train_test_split():
    ds = ray.data.range(N, override_num_blocks=5)
    train, test = ds.train_test_split(test_size=0.25)
    assert ids(train) == list(range(750)) and ids(test) == list(range(750, N))
    train, test = ds.train_test_split(test_size=100)
    assert train.count() == 900 and test.count() == 100
    t1, s1 = ds.train_test_split(test_size=0.2, shuffle=True, seed=42)
    t2, s2 = ds.train_test_split(test_size=0.2, shuffle=True, seed=42)
    a, b = ids(t1), ids(s1)
    assert len(a) == 800 and len(b) == 200 and sorted(a + b) == list(range(N))
    assert set(b) != set(range(800, N))
    assert set(ids(s2)) == set(b) and set(ids(t2)) == set(a)


def main():
    ray.init(num_cpus=4)
    check_split()
    check_split_at_indices()
    check_train_test_split()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
