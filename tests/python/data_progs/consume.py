"""Consuming and inspecting a dataset (Ray Data docs "Iterating over data", "Inspecting data",
"Shuffling data" > local shuffle buffer; API iter_batches, iter_rows, take, take_batch,
take_all, count, schema, columns, show, to_pandas, materialize, stats, iterator):
iter_batches re-batches across blocks into batches of exactly batch_size rows but the last
(dropped with drop_last=True), in the numpy/pandas/pyarrow formats, with any prefetch_batches,
and a local shuffle buffer reorders rows without losing any; a dataset can be iterated again
(each epoch sees every row); iter_rows yields dicts; take/take_batch/take_all/show/to_pandas
give what the docs show; materialize keeps the blocks for reuse; stats() is a summary string."""
import contextlib
import io

import numpy as np
import pandas as pd
import pyarrow as pa

import ray

N = 1000


def dataset():
    return ray.data.range(N, override_num_blocks=7).map_batches(
        lambda b: {"id": b["id"], "x": b["id"] * 0.5})


def check_iter_batches(ds):
    sizes, seen = [], []
    for batch in ds.iter_batches(batch_size=64):
        assert isinstance(batch, dict) and isinstance(batch["id"], np.ndarray)
        sizes.append(len(batch["id"]))
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(N))
    assert sizes[:-1] == [64] * (len(sizes) - 1) and 0 < sizes[-1] <= 64, sizes
    dropped = [len(b["id"]) for b in ds.iter_batches(batch_size=64, drop_last=True)]
    assert dropped == [64] * (N // 64), dropped
    for fmt, kind in [("numpy", dict), ("pandas", pd.DataFrame), ("pyarrow", pa.Table)]:
        batches = list(ds.iter_batches(batch_size=100, batch_format=fmt))
        assert all(isinstance(b, kind) for b in batches), (fmt, type(batches[0]))
        assert sum(len(b) if fmt != "numpy" else len(b["id"]) for b in batches) == N
    for prefetch in (0, 1, 4):
        got = [i for b in ds.iter_batches(batch_size=50, prefetch_batches=prefetch)
               for i in b["id"].tolist()]
        assert sorted(got) == list(range(N)), prefetch
    for epoch in range(2):
        assert sorted(i for b in ds.iter_batches(batch_size=None) for i in b["id"]) == list(
            range(N)), epoch


def check_local_shuffle(ds):
    plain = [i for b in ds.iter_batches(batch_size=50) for i in b["id"].tolist()]
    shuffled = [i for b in ds.iter_batches(batch_size=50, local_shuffle_buffer_size=300,
                                           local_shuffle_seed=11) for i in b["id"].tolist()]
    assert sorted(shuffled) == list(range(N))
    assert shuffled != plain and shuffled != sorted(shuffled)
    sizes = [len(b["id"]) for b in ds.iter_batches(batch_size=50, local_shuffle_buffer_size=300)]
    assert sum(sizes) == N and max(sizes) == 50, sizes


def check_inspect(ds):
    assert ds.count() == N
    assert ds.columns() == ["id", "x"]
    assert ds.schema().names == ["id", "x"] and ds.schema().types == [pa.int64(), pa.float64()]
    rows = list(ds.iter_rows())
    assert len(rows) == N and all(isinstance(r, dict) and r["x"] == r["id"] * 0.5 for r in rows)
    five = ds.take(5)
    assert len(five) == 5 and all(set(r) == {"id", "x"} for r in five)
    assert len(ds.take_all()) == N
    tb = ds.take_batch(8)
    assert set(tb) == {"id", "x"} and tb["id"].shape == (8,), tb
    tbp = ds.take_batch(8, batch_format="pandas")
    assert isinstance(tbp, pd.DataFrame) and len(tbp) == 8
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ds.show(3)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    assert len(lines) == 3 and all(ln.startswith("{") and "'id'" in ln for ln in lines), lines
    df = ds.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == N and list(df.columns) == ["id", "x"]
    assert sorted(df["id"].tolist()) == list(range(N))


def check_materialize_and_stats(ds):
    m = ds.materialize()
    assert type(m).__name__ == "MaterializedDataset", type(m)
    assert m.num_blocks() >= 1 and m.count() == N
    assert sorted(r["id"] for r in m.take_all()) == list(range(N))
    assert sorted(r["id"] for r in m.take_all()) == list(range(N))  # reusable
    stats = m.stats()
    assert isinstance(stats, str) and stats.strip(), repr(stats)
    it = ds.iterator()
    assert sum(len(b["id"]) for b in it.iter_batches(batch_size=100)) == N
    assert isinstance(it.stats(), str)


def main():
    ray.init(num_cpus=4)
    ds = dataset()
    check_iter_batches(ds)
    check_local_shuffle(ds)
    check_inspect(ds)
    check_materialize_and_stats(ds)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
