"""streaming_split (Ray Data docs "Iterating over data" > splitting datasets for distributed
parallel training; API Dataset.streaming_split, DataIterator): n iterators consumed at the same
time by n actors read disjoint parts of one streaming execution that together are the whole
dataset; with equal=True every part has the same number of rows; the iterators can be iterated
again for more epochs (each epoch a new execution, again disjoint and complete); locality_hints
takes node ids; the parts stream through a map_batches pipeline."""
import numpy as np

import ray

N = 1200


@ray.remote
class Trainer:
    def run(self, it, epochs: int):
        seen = []
        for _ in range(epochs):
            ids = []
            for batch in it.iter_batches(batch_size=32):
                ids.extend(batch["id"].tolist())
            seen.append(ids)
        return seen


def consume(iterators, epochs: int):
    trainers = [Trainer.remote() for _ in iterators]
    return ray.get([t.run.remote(it, epochs) for t, it in zip(trainers, iterators)])


def check(ds, n: int, equal: bool, epochs: int, expect_all: bool, **kwargs):
    its = ds.streaming_split(n, equal=equal, **kwargs)
    assert len(its) == n
    per_trainer = consume(its, epochs)
    for e in range(epochs):
        shards = [per_trainer[t][e] for t in range(n)]
        flat = [i for s in shards for i in s]
        assert len(flat) == len(set(flat)), f"epoch {e}: a row went to two shards"
        assert set(flat) <= set(range(N))
        if expect_all:
            assert sorted(flat) == list(range(N)), f"epoch {e}: rows missing"
        if equal:
            sizes = [len(s) for s in shards]
            assert len(set(sizes)) == 1, f"epoch {e}: unequal shards {sizes}"
            assert len(flat) > N - n, (len(flat), N)
        print(f"n={n} equal={equal} epoch={e} sizes={[len(s) for s in shards]}")


def main():
    ray.init(num_cpus=6)
    ds = ray.data.range(N, override_num_blocks=12).map_batches(
        lambda b: {"id": b["id"], "v": np.sqrt(b["id"])})
    check(ds, 2, equal=True, epochs=2, expect_all=True)
    check(ds, 3, equal=True, epochs=1, expect_all=True)  # 1200 = 3 x 400
    check(ray.data.range(N, override_num_blocks=5), 4, equal=False, epochs=2, expect_all=True)
    odd = ray.data.range(N + 1, override_num_blocks=7)
    shards = consume(odd.streaming_split(2, equal=True), 1)
    sizes = [len(s[0]) for s in shards]
    assert sizes[0] == sizes[1] and sum(sizes) >= N, sizes  # at most the odd row dropped
    node = ray.get_runtime_context().get_node_id()
    check(ds, 2, equal=True, epochs=1, expect_all=True, locality_hints=[node, node])
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
