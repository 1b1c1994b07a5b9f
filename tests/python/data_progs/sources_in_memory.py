"""In-memory sources (Ray Data docs "Loading data": synthetic data, from Python objects, NumPy,
pandas and Arrow; API reference "Input/Output"): range, range_tensor, from_items (dicts and plain
values), from_numpy (one array and a list), from_pandas and from_arrow (one and a list) give the
rows, columns and types the docs show, and override_num_blocks sets the number of blocks."""
import numpy as np
import pandas as pd
import pyarrow as pa

import ray


def ids(ds, col="id"):
    return sorted(row[col] for row in ds.take_all())


def check_range():
    ds = ray.data.range(1000)
    assert ds.count() == 1000
    assert ds.columns() == ["id"], ds.columns()
    schema = ds.schema()
    assert schema.names == ["id"] and schema.types == [pa.int64()], schema
    assert ids(ds) == list(range(1000))
    ds8 = ray.data.range(1000, override_num_blocks=8).materialize()
    assert ds8.num_blocks() == 8, ds8.num_blocks()
    assert ds8.count() == 1000


def check_range_tensor():
    ds = ray.data.range_tensor(100, shape=(2, 3))
    assert ds.columns() == ["data"]
    rows = ds.take_all()
    assert len(rows) == 100
    for row in rows:
        arr = row["data"]
        assert isinstance(arr, np.ndarray) and arr.shape == (2, 3), arr
        assert (arr == arr.flat[0]).all()
    assert sorted(int(r["data"].flat[0]) for r in rows) == list(range(100))
    batch = ds.take_batch(10)
    assert batch["data"].shape == (10, 2, 3), batch["data"].shape


def check_from_items():
    ds = ray.data.from_items([{"a": i, "b": str(i)} for i in range(50)])
    assert ds.count() == 50 and ds.columns() == ["a", "b"]
    assert sorted((r["a"], r["b"]) for r in ds.take_all()) == [(i, str(i)) for i in range(50)]
    plain = ray.data.from_items([1, 2, 3])
    assert plain.columns() == ["item"], plain.columns()
    assert ids(plain, "item") == [1, 2, 3]


def check_from_numpy():
    arr = np.arange(24).reshape(6, 2, 2)
    ds = ray.data.from_numpy(arr)
    assert ds.columns() == ["data"] and ds.count() == 6
    got = sorted((r["data"] for r in ds.take_all()), key=lambda a: a.flat[0])
    assert all(np.array_equal(g, arr[i]) for i, g in enumerate(got))
    two = ray.data.from_numpy([np.arange(5), np.arange(5, 12)])
    assert two.count() == 12
    assert ids(two, "data") == list(range(12))


def check_from_pandas_and_arrow():
    df = pd.DataFrame({"x": np.arange(10), "y": np.arange(10) * 0.5})
    ds = ray.data.from_pandas(df)
    assert ds.count() == 10 and ds.columns() == ["x", "y"]
    out = ds.to_pandas().sort_values("x").reset_index(drop=True)
    pd.testing.assert_frame_equal(out, df, check_dtype=False)
    dfs = ray.data.from_pandas([df, df.assign(x=df.x + 10)])
    assert ids(dfs, "x") == list(range(20))

    table = pa.table({"k": list(range(7)), "s": [f"s{i}" for i in range(7)]})
    at = ray.data.from_arrow(table)
    assert at.count() == 7 and at.columns() == ["k", "s"]
    assert at.schema().types == [pa.int64(), pa.string()], at.schema()
    assert sorted(r["s"] for r in at.take_all()) == sorted(f"s{i}" for i in range(7))
    two = ray.data.from_arrow([table, table])
    assert two.count() == 14


def main():
    ray.init(num_cpus=4)
    check_range()
    check_range_tensor()
    check_from_items()
    check_from_numpy()
    check_from_pandas_and_arrow()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
