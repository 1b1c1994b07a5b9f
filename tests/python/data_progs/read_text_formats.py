"""CSV, JSON and text files (Ray Data docs "Loading data" > CSV, JSON, text; API read_csv,
read_json, read_text): read_csv infers column types from a directory of files and takes pyarrow's
parse options (another delimiter); read_json reads JSON lines (the default and lines=True), a
file holding a JSON array of objects (one row per object) and a file holding one object (one
row), from files and directories mixed in one list; read_text gives one "text" row per line,
dropping empty lines unless drop_empty_lines=False; include_paths names each row's file."""
import json
import os
import tempfile

import pyarrow as pa
import pyarrow.csv as pcsv

import ray


def check_csv(d: str):
    os.makedirs(os.path.join(d, "csv"))
    for i in range(3):
        with open(os.path.join(d, "csv", f"f{i}.csv"), "w") as f:
            f.write("id,score,name\n")
            for j in range(i * 10, i * 10 + 10):
                f.write(f"{j},{j / 4},n{j}\n")
    ds = ray.data.read_csv(os.path.join(d, "csv"))
    assert ds.count() == 30 and ds.columns() == ["id", "score", "name"], ds.columns()
    assert ds.schema().types == [pa.int64(), pa.float64(), pa.string()], ds.schema()
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    assert rows[13] == {"id": 13, "score": 3.25, "name": "n13"}, rows[13]

    semi = os.path.join(d, "semi.csv")
    with open(semi, "w") as f:
        f.write("a;b\n1;x\n2;y\n")
    ds = ray.data.read_csv(semi, parse_options=pcsv.ParseOptions(delimiter=";"),
                           include_paths=True)
    rows = sorted(ds.take_all(), key=lambda r: r["a"])
    assert [(r["a"], r["b"]) for r in rows] == [(1, "x"), (2, "y")], rows
    assert all(r["path"].endswith("semi.csv") for r in rows), rows


def check_json(d: str):
    jd = os.path.join(d, "json")
    os.makedirs(jd)
    with open(os.path.join(jd, "lines.jsonl"), "w") as f:
        for i in range(5):
            f.write(json.dumps({"a": i, "b": f"x{i}"}) + "\n")
    with open(os.path.join(jd, "array.json"), "w") as f:
        json.dump([{"a": i, "b": f"y{i}"} for i in range(5, 8)], f)
    single = os.path.join(d, "single.json")
    with open(single, "w") as f:
        json.dump({"a": 100, "b": "one"}, f)

    lines = ray.data.read_json(os.path.join(jd, "lines.jsonl"))
    assert sorted(r["a"] for r in lines.take_all()) == [0, 1, 2, 3, 4]
    lines2 = ray.data.read_json(os.path.join(jd, "lines.jsonl"), lines=True)
    assert sorted((r["a"], r["b"]) for r in lines2.take_all()) == [(i, f"x{i}") for i in range(5)]
    arr = ray.data.read_json(os.path.join(jd, "array.json"))
    assert sorted((r["a"], r["b"]) for r in arr.take_all()) == [(5, "y5"), (6, "y6"), (7, "y7")]
    one = ray.data.read_json(single)
    assert one.take_all() == [{"a": 100, "b": "one"}], one.take_all()
    mixed = ray.data.read_json([jd, single])
    assert sorted(r["a"] for r in mixed.take_all()) == [0, 1, 2, 3, 4, 5, 6, 7, 100]
    assert mixed.schema().types == [pa.int64(), pa.string()], mixed.schema()


def check_text(d: str):
    a, b = os.path.join(d, "a.txt"), os.path.join(d, "b.txt")
    with open(a, "w") as f:
        f.write("hello\n\nworld\n")
    with open(b, "w") as f:
        f.write("foo\nbar baz\n")
    ds = ray.data.read_text([a, b])
    assert ds.columns() == ["text"]
    assert sorted(r["text"] for r in ds.take_all()) == ["bar baz", "foo", "hello", "world"]
    keep = ray.data.read_text(a, drop_empty_lines=False)
    assert sorted(r["text"] for r in keep.take_all()) == ["", "hello", "world"]


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as d:
        check_csv(d)
        check_json(d)
        check_text(d)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
