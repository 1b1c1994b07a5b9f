"""Progress on the console (Ray Data docs "Monitoring your workload" > progress bars; API
DataContext.enable_progress_bars): progress bars are on by default, and a few-second
read_parquet -> map_batches(double_it) -> filter -> map_batches(Tagger, actor pool) execution
reports its progress per operator by name; test_data.py checks that the program's output
(stderr or stdout) names both "MapBatches(double_it)" and "MapBatches(Tagger)"."""
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ray
from ray.data import DataContext


def double_it(batch):
    time.sleep(0.4)  # a few seconds in all: long enough to watch
    return {"id": batch["id"], "y": batch["id"] * 2}


class Tagger:
    def __call__(self, batch):
        return {**batch, "tag": np.full(len(batch["id"]), 7)}


def main():
    ray.init(num_cpus=4)
    assert DataContext.get_current().enable_progress_bars is True
    with tempfile.TemporaryDirectory() as d:
        for i in range(16):
            pq.write_table(pa.table({"id": np.arange(i * 25, i * 25 + 25)}),
                           os.path.join(d, f"p{i:02d}.parquet"))
        ds = (ray.data.read_parquet(d)
              .map_batches(double_it, batch_size=25, concurrency=2)
              .filter(lambda r: r["id"] % 2 == 0)
              .map_batches(Tagger, concurrency=1))
        total = sum(len(b["id"]) for b in ds.iter_batches(batch_size=50))
        assert total == 200, total
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
