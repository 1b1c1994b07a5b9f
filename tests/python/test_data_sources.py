"""torus.data's sources and sinks: each reader's read tasks run in-process (task.read_fn())
against files made in tmp_path, compared with what Ray 2.60 gives for the same files; a few
end-to-end checks through a local cluster at the end (torus_local fixture)."""
import gzip
import json
import os
import pickle

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

from torus.data.datasource import parquet as P
from torus.data.datasource import csv_json, images, in_memory, numpy_source, text_binary
from torus.data.datasource.file_source import FileSourceArgs, split_blocks, split_even
from torus.data.datasource.partitioning import Partitioning, PathPartitionFilter
from torus.data.datasource.paths import expand_paths
from torus.data.block import column_to_numpy

HIVE = Partitioning("hive")


def run(tasks, pickled=True):
    """All rows of ``tasks`` read in this process, after a pickle round trip of each task."""
    out = []
    for t in tasks:
        fn = cloudpickle.loads(cloudpickle.dumps(t.read_fn)) if pickled else t.read_fn
        for block in fn():
            assert isinstance(block, pa.Table)
            out.append(block)
    return pa.concat_tables(out) if out else None


def args(paths, **kw):
    return FileSourceArgs(paths=paths, **kw)


@pytest.fixture
def pq_dir(tmp_path):
    d = tmp_path / "pq"
    (d / "year=2020").mkdir(parents=True)
    (d / "year=2021").mkdir()
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}),
                   d / "year=2020" / "f.parquet", row_group_size=1)
    pq.write_table(pa.table({"a": [4, 5], "b": ["u", "v"]}), d / "year=2021" / "f.parquet")
    (d / "_SUCCESS").write_text("")
    (d / ".hidden").write_text("junk")
    return d


# ---------------------------------------------------------------- paths


def test_paths_directory_skips_hidden_and_underscore(pq_dir):
    _, paths, sizes = expand_paths(str(pq_dir))
    assert [os.path.relpath(p, pq_dir) for p in paths] == ["year=2020/f.parquet",
                                                           "year=2021/f.parquet"]
    assert all(s > 0 for s in sizes)


def test_paths_glob_file_uri_and_list(pq_dir):
    _, g, _ = expand_paths(str(pq_dir / "*" / "*.parquet"))
    _, g2, _ = expand_paths(str(pq_dir / "**" / "*.parquet"))
    _, u, _ = expand_paths([f"file://{pq_dir}/year=2021/f.parquet", str(pq_dir / "year=2020")])
    assert len(g) == 2 and g == g2
    assert u == [str(pq_dir / "year=2021/f.parquet"), str(pq_dir / "year=2020/f.parquet")]


def test_missing_path_raises_file_not_found_naming_it(tmp_path):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(FileNotFoundError, match="No such file or directory: .*nope.parquet"):
        expand_paths(missing)
    with pytest.raises(FileNotFoundError, match=r"nope\*"):
        expand_paths(str(tmp_path / "nope*"))
    (tmp_path / "x.csv").write_text("a\n1\n")
    _, ok, _ = expand_paths([missing, str(tmp_path / "x.csv")], ignore_missing_paths=True)
    assert ok == [str(tmp_path / "x.csv")]


def test_empty_directory_and_extension_filter_raise_value_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="No files found"):
        expand_paths(str(tmp_path / "empty"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="file extensions"):
        P.ParquetSource(args(str(tmp_path / "x.txt"), file_extensions=["parquet"]))


# ---------------------------------------------------------------- parquet


def test_parquet_hive_partitions_and_schema(pq_dir):
    src = P.ParquetSource(args(str(pq_dir), partitioning=HIVE, file_extensions=["parquet"]))
    tasks = src.read_tasks()
    t = run(tasks)
    assert t.to_pylist() == [{"a": 1, "b": "x", "year": "2020"}, {"a": 2, "b": "y", "year": "2020"},
                             {"a": 3, "b": "z", "year": "2020"}, {"a": 4, "b": "u", "year": "2021"},
                             {"a": 5, "b": "v", "year": "2021"}]
    assert tasks[0].schema == t.schema
    assert sum(x.num_rows for x in tasks) == 5
    assert len(tasks) <= 2  # tiny files are never split by row groups


def test_parquet_projection_filter_and_paths(pq_dir):
    src = P.ParquetSource(args(str(pq_dir), partitioning=HIVE, include_paths=True))
    flt = (pds.field("year") == "2020") & (pds.field("a") > 1)
    tasks = src.read_tasks(columns=["a", "year"], filter=flt)
    t = run(tasks)
    assert t.column_names == ["a", "year", "path"]
    assert t.column("a").to_pylist() == [2, 3]
    assert all(p.endswith("year=2020/f.parquet") for p in t.column("path").to_pylist())
    assert all(x.num_rows is None for x in tasks)  # a filter makes counts unknown


def test_parquet_field_types_and_partition_filter(pq_dir):
    part = Partitioning("hive", field_types={"year": int})
    keep = PathPartitionFilter.of(lambda v: v["year"] == "2021")
    t = run(P.ParquetSource(args(str(pq_dir), partitioning=part,
                                 partition_filter=keep)).read_tasks())
    assert t.schema.field("year").type == pa.int64()
    assert t.column("year").to_pylist() == [2021, 2021]


def test_parquet_large_file_split_by_row_groups_and_blocks_capped(tmp_path, monkeypatch):
    n = 400_000
    pq.write_table(pa.table({"x": np.arange(n), "y": np.random.rand(n)}), tmp_path / "big.parquet",
                   row_group_size=25_000)
    src = P.ParquetSource(args(str(tmp_path / "big.parquet"), num_blocks=4))
    tasks = src.read_tasks()
    assert len(tasks) == 4 and sum(t.num_rows for t in tasks) == n
    assert all(t.input_files == [str(tmp_path / "big.parquet")] for t in tasks)
    t = run(tasks)
    assert t.column("x").to_pylist() == list(range(n))
    # each block at most ~target_max_block_size
    from torus.data.context import DataContext
    ctx = DataContext.get_current()
    monkeypatch.setattr(ctx, "target_max_block_size", 1 << 20)
    blocks = [b for task in P.ParquetSource(args(str(tmp_path / "big.parquet"),
                                                 num_blocks=1)).read_tasks()
              for b in task.read_fn()]
    assert len(blocks) >= 6 and sum(b.num_rows for b in blocks) == n
    assert max(b.nbytes for b in blocks) <= 1.2 * (1 << 20)


def test_parquet_many_files_grouped_not_more_tasks_than_files(tmp_path):
    for i in range(10):
        pq.write_table(pa.table({"i": [i] * 10}), tmp_path / f"f{i:02d}.parquet")
    tasks = P.ParquetSource(args(str(tmp_path), num_blocks=3)).read_tasks()
    assert len(tasks) == 3
    assert run(tasks).column("i").to_pylist() == [i for i in range(10) for _ in range(10)]
    assert len(P.ParquetSource(args(str(tmp_path), num_blocks=50)).read_tasks()) == 10


def test_parquet_tensor_column_schema(tmp_path):
    arrs = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(4)]
    pq.write_table(pa.table({"t": [a.tobytes() for a in arrs]}), tmp_path / "t.parquet")
    src = P.ParquetSource(args(str(tmp_path / "t.parquet")),
                          tensor_column_schema={"t": (np.float32, (2, 3))})
    got = column_to_numpy(run(src.read_tasks()).column("t"))
    assert got.shape == (4, 2, 3) and np.array_equal(got, np.stack(arrs))


def test_parquet_read_task_pickles_small(pq_dir):
    task = P.ParquetSource(args(str(pq_dir), partitioning=HIVE)).read_tasks()[0]
    assert len(cloudpickle.dumps(task.read_fn)) < 4096


# ---------------------------------------------------------------- csv / json


def test_csv_types_paths_and_gzip(tmp_path):
    (tmp_path / "a.csv").write_text("a,b\n1,x\n2,y\n")
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write("a,b\n3,z\n")
    t = run(csv_json.csv_tasks(args(str(tmp_path), include_paths=True, partitioning=HIVE),
                               None, {}))
    assert t.column("a").to_pylist() == [1, 2, 3]
    assert t.column("b").to_pylist() == ["x", "y", "z"]
    assert t.column("path").to_pylist()[0].endswith("a.csv")


def test_csv_big_file_streams(tmp_path, monkeypatch):
    rows = "\n".join(f"{i},{i * 2}" for i in range(200_000))
    (tmp_path / "big.csv").write_text("a,b\n" + rows + "\n")
    from torus.data.context import DataContext
    monkeypatch.setattr(DataContext.get_current(), "target_max_block_size", 1 << 20)
    blocks = [b for t in csv_json.csv_tasks(args(str(tmp_path / "big.csv")), None, {})
              for b in t.read_fn()]
    assert len(blocks) > 1 and sum(b.num_rows for b in blocks) == 200_000


def test_csv_invalid_raises_value_error_naming_file(tmp_path):
    (tmp_path / "bad.csv").write_text("a,b\n1,2,3\n")
    with pytest.raises(ValueError, match="bad.csv"):
        run(csv_json.csv_tasks(args(str(tmp_path / "bad.csv")), None, {}))


def test_json_lines_array_and_object(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    (tmp_path / "a.json").write_text(json.dumps([{"x": 3}, {"x": 4}]))
    (tmp_path / "o.json").write_text(json.dumps({"x": 5}))
    ext = ["json", "jsonl"]
    for name, want in (("l.jsonl", [1, 2]), ("a.json", [3, 4]), ("o.json", [5])):
        t = run(csv_json.json_tasks(args(str(tmp_path / name), file_extensions=ext), None, {}))
        assert t.column("x").to_pylist() == want


# ---------------------------------------------------------------- text / binary / numpy


def test_text_lines_and_empty_lines(tmp_path):
    (tmp_path / "t.txt").write_text("hello\n\nworld\n")
    t = run(text_binary.text_tasks(args(str(tmp_path / "t.txt")), encoding="utf-8",
                                   drop_empty_lines=True, arrow_open_stream_args=None))
    assert t.to_pylist() == [{"text": "hello"}, {"text": "world"}]
    t = run(text_binary.text_tasks(args(str(tmp_path / "t.txt"), include_paths=True),
                                   encoding="utf-8", drop_empty_lines=False,
                                   arrow_open_stream_args=None))
    assert t.column("text").to_pylist() == ["hello", "", "world"]
    assert t.column_names == ["text", "path"]


def test_binary_files_one_row_each_merged_into_blocks(tmp_path):
    for i in range(5):
        (tmp_path / f"b{i}").write_bytes(bytes([i]) * (i + 1))
    tasks = text_binary.binary_tasks(args(str(tmp_path), include_paths=True, num_blocks=2),
                                     None)
    assert [t.num_rows for t in tasks] == [3, 2]
    blocks = [b for t in tasks for b in t.read_fn()]
    assert len(blocks) == 2
    t = pa.concat_tables(blocks)
    assert t.column("bytes").to_pylist() == [bytes([i]) * (i + 1) for i in range(5)]
    assert t.column("path").to_pylist()[4].endswith("b4")


def test_numpy_1d_and_nd(tmp_path):
    np.save(tmp_path / "m.npy", np.arange(3))
    np.save(tmp_path / "n.npy", np.arange(12).reshape(3, 2, 2))
    t = run(numpy_source.numpy_tasks(args(str(tmp_path / "m.npy")), allow_pickle=False,
                                     arrow_open_stream_args=None, numpy_load_args={}))
    assert t.schema.field("data").type == pa.int64() and t.column("data").to_pylist() == [0, 1, 2]
    t = run(numpy_source.numpy_tasks(args(str(tmp_path / "n.npy")), allow_pickle=False,
                                     arrow_open_stream_args=None, numpy_load_args={}))
    assert np.array_equal(column_to_numpy(t.column("data")), np.arange(12).reshape(3, 2, 2))


def test_images_size_mode_and_variable_shapes(tmp_path):
    from PIL import Image
    Image.fromarray(np.full((4, 5, 3), 7, np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(np.full((6, 5, 3), 9, np.uint8)).save(tmp_path / "b.png")
    tasks = images.image_tasks(args(str(tmp_path), include_paths=True, num_blocks=1),
                               size=(2, 3), mode="L", arrow_open_file_args=None)
    t = run(tasks)
    arr = column_to_numpy(t.column("image"))
    assert arr.shape == (2, 2, 3) and arr.dtype == np.uint8
    assert t.column("path").to_pylist()[1].endswith("b.png")
    Image.fromarray(np.full((6, 5), 9, np.uint8)).save(tmp_path / "c.png")
    blocks = [b for t in images.image_tasks(args(str(tmp_path), num_blocks=1), size=None,
                                            mode=None, arrow_open_file_args=None)
              for b in t.read_fn()]
    shapes = [column_to_numpy(b.column("image")).shape for b in blocks]
    assert shapes == [(1, 4, 5, 3), (1, 6, 5, 3), (1, 6, 5)]  # a block per shape run
    with pytest.raises(ValueError, match="positive"):
        images.image_tasks(args(str(tmp_path)), size=(0, 3), mode=None,
                           arrow_open_file_args=None)


# ---------------------------------------------------------------- in-memory and range


def test_range_blocks_as_ray():
    tasks, _ = in_memory.range_tasks(10, None, 3)
    assert [t.num_rows for t in tasks] == [3, 3, 3, 1]  # Ray: n // parallelism per task
    assert run(tasks).column("id").to_pylist() == list(range(10))
    assert pickle.loads(pickle.dumps(tasks[0].read_fn)) is not None


def test_range_tensor_values_and_shape():
    tasks, _ = in_memory.range_tasks(5, (2, 3), 2)
    data = column_to_numpy(run(tasks).column("data"))
    assert data.shape == (5, 2, 3) and data.dtype == np.int64
    assert all((data[i] == i).all() for i in range(5))


def test_from_items_and_resplit():
    tables = in_memory.items_tables([1, 2, 3, 4, 5], 2)
    assert [t.num_rows for t in tables] == [3, 2]
    assert tables[0].to_pylist() == [{"item": 1}, {"item": 2}, {"item": 3}]
    t = in_memory.items_tables([{"a": 1, "v": np.zeros(3)}], None)[0]
    assert column_to_numpy(t.column("v")).shape == (1, 3)
    assert [t.num_rows for t in in_memory.resplit([pa.table({"x": list(range(7))})], 3)] == \
        [3, 2, 2]


def test_split_helpers():
    assert split_even(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_even([1], 4) == [[1]]
    t = pa.table({"x": np.arange(1000, dtype=np.int64)})
    assert [b.num_rows for b in split_blocks(t, 2000)] == [250] * 4


# ---------------------------------------------------------------- end to end (a local cluster)


def test_e2e_read_parquet_columns_filter_count(torus_local, pq_dir):
    import torus.data as rd
    ds = rd.read_parquet(str(pq_dir))
    assert ds.count() == 5
    assert sorted(ds.columns()) == ["a", "b", "year"]
    got = rd.read_parquet(str(pq_dir), columns=["a"], filter=pds.field("a") >= 3).take_all()
    assert sorted(r["a"] for r in got) == [3, 4, 5]
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        rd.read_parquet(str(pq_dir / "missing_dir"))


def test_e2e_sources_in_memory(torus_local):
    import pandas as pd
    import torus.data as rd
    assert rd.range(10, override_num_blocks=3).take_all()[-1] == {"id": 9}
    assert rd.range_tensor(6, shape=(2, 2)).take_batch(3)["data"].shape == (3, 2, 2)
    assert rd.from_items([1, 2]).take_all() == [{"item": 1}, {"item": 2}]
    assert rd.from_numpy(np.ones((4, 3))).take_batch(4)["data"].shape == (4, 3)
    assert rd.from_pandas(pd.DataFrame({"a": [1, 2]})).count() == 2
    assert rd.from_arrow(pa.table({"a": [1, 2, 3]})).take_all()[2] == {"a": 3}


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "numpy"])
def test_e2e_write_then_read_back(torus_local, tmp_path, fmt):
    import re
    import torus.data as rd
    out = str(tmp_path / fmt)
    if fmt == "numpy":
        rd.range_tensor(20, shape=(2,), override_num_blocks=2).write_numpy(out, column="data")
        back = rd.read_numpy(out).take_batch(20)["data"]
        assert sorted(back[:, 0].tolist()) == list(range(20))
    else:
        getattr(rd.range(20, override_num_blocks=2), f"write_{fmt}")(out)
        back = getattr(rd, f"read_{fmt}")(out).take_all()
        assert sorted(r["id"] for r in back) == list(range(20))
    names = sorted(os.listdir(out))
    ext = {"numpy": "npy"}.get(fmt, fmt)
    suffix = r"-0\.parquet" if fmt == "parquet" else rf"\.{ext}"
    assert len(names) == 2
    assert all(re.fullmatch(rf"[0-9a-f]+_[0-9a-f]{{32}}_00000[01]{suffix}", n) for n in names)


def test_e2e_write_modes_and_partition_cols(torus_local, tmp_path):
    import torus.data as rd
    out = str(tmp_path / "p")
    ds = rd.from_items([{"k": i % 2, "v": i} for i in range(6)])
    ds.write_parquet(out, partition_cols=["k"])
    assert sorted(os.listdir(out)) == ["k=0", "k=1"]
    assert sorted(r["v"] for r in rd.read_parquet(out).take_all()) == list(range(6))
    with pytest.raises(ValueError, match="already exists"):
        ds.write_parquet(out, mode="error")
    ds.write_parquet(out, mode="overwrite")
    assert rd.read_parquet(out).count() == 6


def test_paths_uri_forms_and_explicit_filesystem():
    import pyarrow.fs as pafs
    from torus.data.datasource.paths import resolve_filesystem
    fs, paths = resolve_filesystem(["gs://anonymous@bkt/a/b.parquet", "gs://bkt/c"])
    assert type(fs).__name__ == "GcsFileSystem" and paths == ["bkt/a/b.parquet", "bkt/c"]
    mock = pafs._MockFileSystem()
    mock.create_dir("bucket/data/year=1")
    pq.write_table(pa.table({"a": [1, 2]}), "bucket/data/year=1/x.parquet", filesystem=mock)
    with mock.open_output_stream("bucket/data/_SUCCESS") as f:
        f.write(b"")
    assert expand_paths("mock://bucket/data/*/*.parquet", mock)[1] == \
        ["bucket/data/year=1/x.parquet"]
    src = P.ParquetSource(args("bucket/data", filesystem=mock, partitioning=HIVE))
    assert run(src.read_tasks(), pickled=False).to_pylist() == [{"a": 1, "year": "1"},
                                                                 {"a": 2, "year": "1"}]
    with pytest.raises(ValueError, match="not on the local filesystem"):
        resolve_filesystem(["/tmp/x", "s3://bucket/y"])


def test_dir_partitioning_and_filter(tmp_path):
    for year, country in (("2020", "us"), ("2021", "fr")):
        d = tmp_path / year / country
        d.mkdir(parents=True)
        (d / "x.csv").write_text("v\n1\n")
    part = Partitioning("dir", base_dir=str(tmp_path), field_names=["year", "country"])
    keep = PathPartitionFilter.of(lambda v: v["country"] == "fr", style="dir",
                                  base_dir=str(tmp_path), field_names=["year", "country"])
    t = run(csv_json.csv_tasks(args(str(tmp_path), partitioning=part, partition_filter=keep),
                               None, {}))
    assert t.to_pylist() == [{"v": 1, "year": "2021", "country": "fr"}]
    with pytest.raises(ValueError, match="field names"):
        run(csv_json.csv_tasks(args(str(tmp_path), partitioning=Partitioning("dir")), None, {}))
