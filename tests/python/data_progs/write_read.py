"""Sinks (Ray Data docs "Saving data"; API write_parquet, write_csv, write_json, write_numpy):
each writes files of its format into the directory given (created if missing; a file:// URI
too, or a path relative to another pyarrow filesystem given as filesystem=) and reading them
back with the matching reader gives the same rows and types; write_json writes JSON lines;
write_numpy writes a tensor column as .npy files; the written files are ordinary files pyarrow,
pandas and numpy read."""
import glob
import json
import os
import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

import ray

N = 500


def table_rows(ds):
    return sorted((r["id"], r["name"], r["score"]) for r in ds.take_all())


def source():
    return ray.data.range(N, override_num_blocks=4).map_batches(
        lambda b: {"id": b["id"], "name": np.array([f"n{i}" for i in b["id"]]),
                   "score": b["id"] / 8.0})


def check_parquet(d, ds, expect):
    out = os.path.join(d, "pq")
    ds.write_parquet(out)
    files = glob.glob(os.path.join(out, "*.parquet"))
    assert files, os.listdir(out)
    assert sum(pq.read_table(f).num_rows for f in files) == N
    back = ray.data.read_parquet(out)
    assert back.schema().types == [pa.int64(), pa.string(), pa.float64()], back.schema()
    assert table_rows(back) == expect
    uri = os.path.join(d, "pq_uri")
    ds.write_parquet("file://" + uri)
    assert table_rows(ray.data.read_parquet(uri)) == expect
    sub = pyarrow.fs.SubTreeFileSystem(d, pyarrow.fs.LocalFileSystem())
    ds.write_parquet("pq_sub", filesystem=sub)   # relative to the filesystem's root
    assert glob.glob(os.path.join(d, "pq_sub", "*.parquet"))
    assert table_rows(ray.data.read_parquet("pq_sub", filesystem=sub)) == expect


def check_csv(d, ds, expect):
    out = os.path.join(d, "csv")
    ds.write_csv(out)
    files = glob.glob(os.path.join(out, "*.csv"))
    assert files and sum(len(pd.read_csv(f)) for f in files) == N
    assert table_rows(ray.data.read_csv(out)) == expect


def check_json(d, ds, expect):
    out = os.path.join(d, "json")
    ds.write_json(out)
    files = glob.glob(os.path.join(out, "*.json"))
    assert files, os.listdir(out)
    with open(files[0]) as f:
        first = json.loads(f.readline())  # JSON lines: one object per line
    assert set(first) == {"id", "name", "score"}, first
    assert table_rows(ray.data.read_json(out)) == expect


def check_numpy(d):
    out = os.path.join(d, "npy")
    ds = ray.data.range_tensor(64, shape=(2, 3))
    ds.write_numpy(out, column="data")
    files = glob.glob(os.path.join(out, "*.npy"))
    assert files and sum(np.load(f).shape[0] for f in files) == 64
    assert all(np.load(f).shape[1:] == (2, 3) for f in files)
    back = ray.data.read_numpy(out)
    vals = sorted(int(r["data"].flat[0]) for r in back.take_all())
    assert vals == list(range(64))
    assert all(r["data"].shape == (2, 3) for r in back.take_all())


def main():
    ray.init(num_cpus=4)
    ds = source().materialize()
    expect = [(i, f"n{i}", i / 8.0) for i in range(N)]
    with tempfile.TemporaryDirectory() as d:
        check_parquet(d, ds, expect)
        check_csv(d, ds, expect)
        check_json(d, ds, expect)
        check_numpy(d)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
