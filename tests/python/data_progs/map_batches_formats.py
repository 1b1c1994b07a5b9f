"""map_batches with functions (Ray Data docs "Transforming data" > transforming batches,
configuring batch format and batch size; API Dataset.map_batches): the UDF receives a dict of
NumPy arrays by default and with batch_format="numpy", a pandas DataFrame with "pandas", a
pyarrow Table with "pyarrow", and may return any of the three; batches hold at most batch_size
rows (exactly batch_size but the last from a single block); a batch may grow or shrink the row
count; fn_args/fn_kwargs reach the UDF; num_cpus, num_gpus, memory and custom resources are
honoured (the UDF is given the GPU it asked for; asking for GPUs without a batch_size is a
ValueError; which GPU, ray.get_gpu_ids(), is gpu_ids.py's)."""
import numpy as np
import pandas as pd
import pyarrow as pa

import ray


def kind_of(batch) -> str:
    if isinstance(batch, dict):
        assert all(isinstance(v, np.ndarray) for v in batch.values()), batch
        return "numpy"
    if isinstance(batch, pd.DataFrame):
        return "pandas"
    if isinstance(batch, pa.Table):
        return "pyarrow"
    return type(batch).__name__


def tag_numpy(batch):
    return {"id": batch["id"], "kind": np.array([kind_of(batch)] * len(batch["id"]))}


def tag_pandas(df):
    return df.assign(kind=kind_of(df))


def tag_arrow(table):
    return table.append_column("kind", pa.array([kind_of(table)] * table.num_rows))


def check_formats():
    ds = ray.data.range(200, override_num_blocks=4)
    for fmt, fn, want in [(None, tag_numpy, "numpy"), ("numpy", tag_numpy, "numpy"),
                          ("pandas", tag_pandas, "pandas"), ("pyarrow", tag_arrow, "pyarrow")]:
        kwargs = {} if fmt is None else {"batch_format": fmt}
        rows = ds.map_batches(fn, **kwargs).take_all()
        assert sorted(r["id"] for r in rows) == list(range(200)), fmt
        kinds = {r["kind"] for r in rows}
        assert kinds == {want}, (fmt, kinds)
    # The output format need not match the input's.
    out = ds.map_batches(lambda df: pa.Table.from_pandas(df[["id"]] * 2, preserve_index=False),
                         batch_format="pandas")
    assert sorted(r["id"] for r in out.take_all()) == list(range(0, 400, 2))


def check_batch_size():
    def sizes(batch):
        return {"n": np.array([len(batch["id"])])}

    one_block = ray.data.range(95, override_num_blocks=1)
    got = sorted(r["n"] for r in one_block.map_batches(sizes, batch_size=10).take_all())
    assert got == [5] + [10] * 9, got
    many = ray.data.range(1000, override_num_blocks=7)
    got = [r["n"] for r in many.map_batches(sizes, batch_size=64).take_all()]
    assert sum(got) == 1000 and max(got) <= 64, got
    whole = [r["n"] for r in many.map_batches(sizes, batch_size=None).take_all()]
    assert sum(whole) == 1000


def check_row_count_changes_and_args():
    def explode(batch, times, offset=0):
        return {"id": np.repeat(batch["id"], times) + offset}

    ds = ray.data.range(50).map_batches(explode, fn_args=(3,), fn_kwargs={"offset": 1000})
    ids = sorted(r["id"] for r in ds.take_all())
    assert ids == sorted(list(range(1000, 1050)) * 3)
    odd = ray.data.range(50).map_batches(lambda b: {"id": b["id"][b["id"] % 2 == 1]})
    assert sorted(r["id"] for r in odd.take_all()) == list(range(1, 50, 2))


def check_resources():
    def gpu_ids(batch):
        given = ray.get_runtime_context().get_assigned_resources().get("GPU", 0)
        return {"given": np.full(len(batch["id"]), given)}

    ds = ray.data.range(40, override_num_blocks=4)
    assert ds.map_batches(lambda b: b, num_cpus=2).count() == 40
    assert ds.map_batches(lambda b: b, memory=200 * 1024 * 1024).count() == 40
    assert ds.map_batches(lambda b: b, resources={"custom": 1}).count() == 40
    try:  # the docs require a batch_size with GPUs
        ds.map_batches(gpu_ids, num_gpus=1)
    except ValueError as e:
        assert "batch_size" in str(e), str(e)
    else:
        raise AssertionError("map_batches(num_gpus=1) without batch_size did not fail")
    rows = ds.map_batches(gpu_ids, num_gpus=1, batch_size=8).take_all()
    assert len(rows) == 40 and {r["given"] for r in rows} == {1}, {r["given"] for r in rows}


def main():
    ray.init(num_cpus=4, num_gpus=1, resources={"custom": 2})
    check_formats()
    check_batch_size()
    check_row_count_changes_and_args()
    check_resources()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
