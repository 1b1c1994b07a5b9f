"""Parquet (Ray Data docs "Loading data" > Parquet; API ray.data.read_parquet): a directory, a
list of files, a single file, file:// URIs, an explicit pyarrow LocalFileSystem and another
pyarrow filesystem (SubTreeFileSystem, paths relative to its root) read every row with the
files' schema; column projection (select_columns, and the columns= argument) keeps only the
named columns; a row filter given as an expression (filter(expr=col(...) ...)), which the
docs say is pushed down to the file scan, keeps exactly the matching rows; Hive-style partition
directories (key=value) become string columns that filters can select on; include_paths adds the
source path of each row."""
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

import ray
from ray.data.expressions import col, lit

N_FILES, ROWS = 4, 250


def write_files(d: str):
    for i in range(N_FILES):
        ids = np.arange(i * ROWS, (i + 1) * ROWS)
        table = pa.table({"id": ids, "x": ids / 1000.0, "s": [f"v{v}" for v in ids]})
        pq.write_table(table, os.path.join(d, f"part-{i}.parquet"))


def write_hive(d: str):
    for year in (2023, 2024):
        for month in (1, 2):
            sub = os.path.join(d, f"year={year}", f"month={month}")
            os.makedirs(sub)
            vals = np.arange(10) + year * 100 + month
            pq.write_table(pa.table({"v": vals}), os.path.join(sub, "data.parquet"))


def check_paths(d: str):
    total = N_FILES * ROWS
    ds = ray.data.read_parquet(d)
    assert ds.count() == total
    assert ds.columns() == ["id", "x", "s"], ds.columns()
    assert ds.schema().types == [pa.int64(), pa.float64(), pa.string()], ds.schema()
    assert sorted(r["id"] for r in ds.take_all()) == list(range(total))
    files = [os.path.join(d, f"part-{i}.parquet") for i in (1, 3)]
    listed = ray.data.read_parquet(files)
    expect = sorted(list(range(ROWS, 2 * ROWS)) + list(range(3 * ROWS, 4 * ROWS)))
    assert sorted(r["id"] for r in listed.take_all()) == expect
    one = ray.data.read_parquet(files[0])
    assert one.count() == ROWS
    uri = ray.data.read_parquet("file://" + d)
    assert uri.count() == total
    fs = ray.data.read_parquet(d, filesystem=pyarrow.fs.LocalFileSystem())
    assert fs.count() == total
    # Any pyarrow filesystem (as gs:// and s3:// resolve to one): paths are relative to it.
    sub = pyarrow.fs.SubTreeFileSystem(os.path.dirname(d), pyarrow.fs.LocalFileSystem())
    rel = ray.data.read_parquet(os.path.basename(d), filesystem=sub)
    assert sorted(r["id"] for r in rel.take_all()) == list(range(total))
    with_paths = ray.data.read_parquet(files[0], include_paths=True)
    paths = {r["path"] for r in with_paths.take_all()}
    assert len(paths) == 1 and paths.pop().endswith("part-1.parquet"), paths


def check_projection_and_filter(d: str):
    proj = ray.data.read_parquet(d).select_columns(["id", "s"])
    assert proj.columns() == ["id", "s"], proj.columns()
    row = proj.take(1)[0]
    assert set(row) == {"id", "s"} and row["s"] == f"v{row['id']}", row
    old = ray.data.read_parquet(d, columns=["x"])
    assert old.columns() == ["x"] and old.count() == N_FILES * ROWS

    filtered = ray.data.read_parquet(d).filter(expr=(col("x") >= lit(0.5)) & (col("id") % 2 == 0))
    got = sorted(r["id"] for r in filtered.take_all())
    assert got == list(range(500, N_FILES * ROWS, 2)), got[:5]
    both = (ray.data.read_parquet(d).filter(expr=col("s") == lit("v7"))
            .select_columns(["id"]))
    assert both.take_all() == [{"id": 7}]


def check_hive(d: str):
    ds = ray.data.read_parquet(d)
    assert ds.count() == 40
    assert set(ds.columns()) == {"v", "year", "month"}, ds.columns()
    # Hive partition values are strings (Partitioning's default field type).
    assert ds.schema().types[ds.columns().index("year")] == pa.string(), ds.schema()
    for r in ds.take_all():
        assert r["v"] // 100 == int(r["year"]) and r["v"] % 100 - int(r["month"]) in range(10), r
    only = ds.filter(expr=col("year") == lit("2024"))
    assert only.count() == 20
    assert {str(r["year"]) for r in only.take_all()} == {"2024"}


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as tmp:
        flat, hive = os.path.join(tmp, "flat"), os.path.join(tmp, "hive")
        os.makedirs(flat)
        write_files(flat)
        write_hive(hive)
        check_paths(flat)
        check_projection_and_filter(flat)
        check_hive(hive)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
