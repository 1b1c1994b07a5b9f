"""Failed tasks are retried (Ray Data docs "Fault tolerance" in Ray Data / "Execution
configurations"; Ray Core's task retries on system failures): a read+map task whose worker
process dies (os._exit) is run again and the dataset still has every row exactly once; an
actor of a map_batches actor pool whose process dies is restarted and its batch retried; the
read of a Parquet file whose reader process dies is retried too."""
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ray


def crash_once(marker: str):
    """Kills this worker process the first time it is called with this marker."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as d:
        def die_on_zero(batch):
            if 0 in batch["id"]:
                crash_once(os.path.join(d, "task"))
            return batch

        ids = [r["id"] for r in ray.data.range(400, override_num_blocks=8)
               .map_batches(die_on_zero).take_all()]
        assert sorted(ids) == list(range(400)), len(ids)
        assert os.path.exists(os.path.join(d, "task"))

        class DieOnce:
            def __init__(self, marker):
                self.marker = marker

            def __call__(self, batch):
                if 100 in batch["id"]:
                    crash_once(self.marker)
                return {"id": batch["id"], "pid": np.full(len(batch["id"]), os.getpid())}

        rows = ray.data.range(400, override_num_blocks=8).map_batches(
            DieOnce, fn_constructor_args=(os.path.join(d, "actor"),), concurrency=2).take_all()
        assert sorted(r["id"] for r in rows) == list(range(400)), len(rows)
        assert os.path.exists(os.path.join(d, "actor"))

        pq_dir = os.path.join(d, "pq")
        os.makedirs(pq_dir)
        for i in range(4):
            pq.write_table(pa.table({"id": np.arange(i * 50, i * 50 + 50)}),
                           os.path.join(pq_dir, f"p{i}.parquet"))
        marker = os.path.join(d, "read")

        def die_in_read(batch):
            if 0 in batch["id"]:
                crash_once(marker)
            return batch

        got = ray.data.read_parquet(pq_dir).map_batches(die_in_read).take_all()
        assert sorted(r["id"] for r in got) == list(range(200))
        assert os.path.exists(marker)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
