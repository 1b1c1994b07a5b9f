#!/usr/bin/env python3
"""One pipeline of bench/data_bench.py, run once: plain Ray Data code, so the same file runs on
Ray 2.60 (`.venv-ray/bin/python data_bench_prog.py ...`) and on Torus
(`.venv-py/bin/python -m torus.ray data_bench_prog.py ...`); `--pipeline floor` imports no
framework at all (pyarrow and multiprocessing only).

  data_bench_prog.py --pipeline {parquet,actor,rowmap,floor} --data-dir DIR [--map-rows N]

Pipelines (bench/data_bench.py's docstring says why this shape):
  parquet  read_parquet(DIR) -> map_batches(transform, batch_format="numpy")
           -> iter_batches(batch_size=1024) consumed here, in the driver
  actor    the same with a callable class on an actor pool (concurrency=2, num_cpus=0.5)
  rowmap   range(N).map(row fn) -> iter_batches(batch_size=1024)
  floor    2 processes (multiprocessing.Pool), each reading whole files with
           pyarrow.parquet.read_table and walking them in 1024-row record batches

Protocol with the parent (stdout, one line each, flushed): `SESSION <dir>` after ray.init
(the parent also watches processes naming that directory), `START` just before the pipeline
is built, `RESULT <json>` at the end: rows and bytes that reached the consumer (bytes = the
in-memory size of the batches: numpy nbytes, equal to Arrow's for these fixed-width columns),
wall seconds from building the dataset to the last batch consumed.
"""
import argparse
import glob
import json
import os
import sys
import time

import numpy as np

BATCH = 1024
# The actor's num_cpus: with Ray's default (1 CPU per actor) Ray 2.60 deadlocks on this
# 2-CPU machine (its ListFiles task waits for a CPU both actors hold). 0.5 on both systems.
ACTOR_CPUS = 0.5


def transform(batch: dict) -> dict:
    """The cheap numpy step of the parquet pipeline: standardise the dense features, binarise
    the label, scale the embedding (writes a new 1 KB per row, as a real normalisation does)."""
    for k in [c for c in batch if c.startswith("f")]:
        batch[k] = (batch[k] - np.float32(0.5)) * np.float32(3.4641)
    batch["label"] = (batch["label"] > np.float32(0.5)).astype(np.float32)
    batch["emb"] = batch["emb"] * np.float32(0.5)
    return batch


class Normalizer:
    """The actor pipeline's UDF: state made once per actor (as a model or tokenizer would be)."""

    def __init__(self) -> None:
        self.mean = np.float32(0.5)
        self.scale = np.float32(3.4641)

    def __call__(self, batch: dict) -> dict:
        for k in [c for c in batch if c.startswith("f")]:
            batch[k] = (batch[k] - self.mean) * self.scale
        batch["label"] = (batch["label"] > self.mean).astype(np.float32)
        batch["emb"] = batch["emb"] * np.float32(0.5)
        return batch


def row_fn(row: dict) -> dict:
    i = row["id"]
    return {"id": i, "x": float(i) * 0.5, "bucket": i % 7}


def consume(it) -> tuple:
    rows = nbytes = 0
    for b in it:
        rows += len(b["id"])
        nbytes += sum(v.nbytes for v in b.values())
    return rows, nbytes


def run_ray(pipeline: str, data_dir: str, map_rows: int) -> dict:
    import ray
    ctx = ray.init()
    info = getattr(ctx, "address_info", None) or {}
    print(f"SESSION {info.get('session_dir', '')}", flush=True)
    ray.data.DataContext.get_current()  # import and set up Data before timing
    time.sleep(1.0)  # an idle sample for the parent, after init's spawns settled
    print("START", flush=True)
    t0 = time.perf_counter()
    if pipeline == "parquet":
        ds = ray.data.read_parquet(data_dir).map_batches(transform, batch_format="numpy")
    elif pipeline == "actor":
        ds = ray.data.read_parquet(data_dir).map_batches(
            Normalizer, batch_format="numpy", concurrency=2, num_cpus=ACTOR_CPUS)
    elif pipeline == "rowmap":
        ds = ray.data.range(map_rows).map(row_fn)
    else:
        raise ValueError(pipeline)
    rows, nbytes = consume(ds.iter_batches(batch_size=BATCH))
    wall = time.perf_counter() - t0
    ray.shutdown()
    return {"rows": rows, "bytes": nbytes, "wall_s": wall}


def _warm(_: int) -> None:
    import pyarrow.parquet  # noqa: F401
    time.sleep(0.2)  # so that each worker takes one


def _row_bytes(schema) -> int:
    """Bytes per row of fixed-width columns as numpy holds them (what the pipelines count;
    Arrow's nbytes of a sliced batch adds validity bitmaps and whole child buffers)."""
    import pyarrow as pa
    total = 0
    for f in schema:
        t, n = f.type, 1
        while pa.types.is_fixed_size_list(t):
            n *= t.list_size
            t = t.value_type
        total += n * t.byte_width
    return total


def _read_file(path: str) -> tuple:
    import pyarrow.parquet as pq
    rows = 0
    table = pq.read_table(path)
    for b in table.to_batches(max_chunksize=BATCH):
        rows += b.num_rows
    return rows, rows * _row_bytes(table.schema)


def run_floor(data_dir: str, procs: int) -> dict:
    import multiprocessing as mp
    files = sorted(glob.glob(os.path.join(data_dir, "*.parquet")))
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(_warm, range(procs), chunksize=1)  # workers up, pyarrow imported, untimed
        print("START", flush=True)
        t0 = time.perf_counter()
        parts = pool.map(_read_file, files, chunksize=1)
        wall = time.perf_counter() - t0
    return {"rows": sum(p[0] for p in parts), "bytes": sum(p[1] for p in parts),
            "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", required=True, choices=["parquet", "actor", "rowmap", "floor"])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--map-rows", type=int, default=1_000_000)
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    if a.pipeline == "floor":
        res = run_floor(a.data_dir, a.procs)
    else:
        res = run_ray(a.pipeline, a.data_dir, a.map_rows)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
