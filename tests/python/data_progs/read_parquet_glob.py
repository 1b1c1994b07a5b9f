"""Glob patterns in read_parquet paths (issue #43 asks for them: "read_parquet (directories,
globs, lists of paths ...)"): a pattern selects exactly the files it matches, alone or in a
list, and a pattern that matches nothing is a FileNotFoundError naming it. Ray 2.60 itself does
not expand globs (it looks the pattern up as a literal path: test_data.RAY_CANNOT)."""
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ray


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as d:
        for i in range(6):
            name = f"train-{i}.parquet" if i < 4 else f"test-{i}.parquet"
            pq.write_table(pa.table({"id": np.arange(i * 10, i * 10 + 10)}),
                           os.path.join(d, name))
        train = ray.data.read_parquet(os.path.join(d, "train-*.parquet"))
        assert sorted(r["id"] for r in train.take_all()) == list(range(40))
        every = ray.data.read_parquet(os.path.join(d, "*.parquet"))
        assert every.count() == 60
        mixed = ray.data.read_parquet([os.path.join(d, "test-4.parquet"),
                                       os.path.join(d, "train-[01].parquet")])
        assert sorted(r["id"] for r in mixed.take_all()) == list(range(20)) + list(range(40, 50))
        pattern = os.path.join(d, "nothing-*.parquet")
        try:
            ray.data.read_parquet(pattern).count()
        except FileNotFoundError as e:
            assert "nothing-*.parquet" in str(e), str(e)
        else:
            raise AssertionError("a glob matching no file did not fail")
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
