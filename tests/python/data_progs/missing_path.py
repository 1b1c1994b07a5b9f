"""A path that does not exist is a clear error (Ray Data's readers raise FileNotFoundError
naming the path, before any data is read): read_parquet, read_csv, read_json, read_text,
read_numpy, read_binary_files and read_images given a missing file, a missing directory or a
list with one missing path raise FileNotFoundError whose message names the missing path; with
ignore_missing_paths=True the existing files are read; the cluster keeps working."""
import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

import ray

READERS = ["read_parquet", "read_csv", "read_json", "read_text", "read_numpy",
           "read_binary_files", "read_images"]


def expect_missing(reader: str, paths, missing: str):
    try:
        ds = getattr(ray.data, reader)(paths)
        ds.materialize()  # whether the reader checks eagerly or on execution
    except FileNotFoundError as e:
        assert missing in str(e), f"{reader}: {missing!r} not in {str(e)!r}"
    else:
        raise AssertionError(f"{reader}({paths!r}) did not raise FileNotFoundError")


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "good.parquet")
        pq.write_table(pa.table({"id": list(range(10))}), good)
        gone_file = os.path.join(d, "no_such_file.parquet")
        gone_dir = os.path.join(d, "no_such_dir")
        for reader in READERS:
            expect_missing(reader, gone_file, "no_such_file.parquet")
            expect_missing(reader, gone_dir, "no_such_dir")
        expect_missing("read_parquet", [good, gone_file], "no_such_file.parquet")
        ds = ray.data.read_parquet([good, gone_file], ignore_missing_paths=True)
        assert ds.count() == 10
    assert ray.data.range(100).map_batches(lambda b: b).count() == 100
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
