"""Progress on the console (Ray Data docs "Monitoring your workload" > progress bars; API
DataContext.enable_progress_bars): progress bars are on by default, and executing a
read_parquet -> map_batches(double_it) -> filter pipeline reports progress per operator by its
name; test_data.py checks the program's output (stderr or stdout) names
"MapBatches(double_it)"."""
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ray
from ray.data import DataContext


def double_it(batch):
    return {"id": batch["id"], "y": batch["id"] * 2}


def main():
    ray.init(num_cpus=4)
    assert DataContext.get_current().enable_progress_bars is True
    with tempfile.TemporaryDirectory() as d:
        for i in range(4):
            pq.write_table(pa.table({"id": np.arange(i * 100, i * 100 + 100)}),
                           os.path.join(d, f"p{i}.parquet"))
        ds = ray.data.read_parquet(d).map_batches(double_it).filter(lambda r: r["id"] % 2 == 0)
        total = sum(len(b["id"]) for b in ds.iter_batches(batch_size=50))
        assert total == 200, total
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
