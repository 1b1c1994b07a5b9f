"""Spilling throughput as one Ray program, unchanged on both runtimes:

    python -m torus.ray bench/spill_bench.py [--gib 3] [--rounds 3] [--spill-dir DIR] [--drop-caches]
    python bench/spill_bench.py ...                                            # on Ray

A private cluster with a 1 GiB object store (object_store_memory) spilling to DIR
(object_spilling_directory). Each round first puts and reads 512 MiB that fit (nothing spilled),
then puts `--gib` GiB of 64 MiB numpy arrays (all but the last ~1 GiB spilled) and reads every one
back in the order put, so each read restores its value from disk (and spills an older one to make
room). Reads are zero-copy: a read's time is the restore. Prints one JSON line per round and the
medians. --drop-caches (root) empties the page cache before the reads, so restores read the disk
rather than the cache the spills just filled. With RAY_ADDRESS set it connects to that cluster
instead (start it with --object-store-memory 1073741824 and the spill directory).
"""
import argparse
import json
import os
import statistics
import time

import numpy as np
import ray

PIECE = 64 << 20


def gbps(nbytes, seconds):
    return round(nbytes / 1e9 / seconds, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spill-dir", default="/tmp/torus-spill-bench")
    ap.add_argument("--drop-caches", action="store_true")
    a = ap.parse_args()
    if os.environ.get("RAY_ADDRESS"):  # a running cluster started with the same store size and dir
        ray.init()
    else:
        ray.init(num_cpus=1, object_store_memory=1 << 30, object_spilling_directory=a.spill_dir)
    piece = np.ones(PIECE, dtype=np.uint8)
    n = a.gib * 16
    rows = []
    for r in range(a.rounds):
        refs = []
        t0 = time.perf_counter()
        for _ in range(8):
            refs.append(ray.put(piece))
        base_put = gbps(8 * PIECE, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for ref in refs:
            v = ray.get(ref)
            assert v.nbytes == PIECE
            del v
        base_get = gbps(8 * PIECE, time.perf_counter() - t0)
        del refs
        refs = []
        t0 = time.perf_counter()
        for i in range(n):
            piece[0] = i % 256
            refs.append(ray.put(piece))
        put = gbps(n * PIECE, time.perf_counter() - t0)
        if a.drop_caches:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        t0 = time.perf_counter()
        bad = 0
        for i, ref in enumerate(refs):
            v = ray.get(ref)
            bad += int(v[0]) != i % 256 or v.nbytes != PIECE
            del v
        get = gbps(n * PIECE, time.perf_counter() - t0)
        del refs
        row = {"round": r, "gib": a.gib, "put_in_store_gb_per_s": base_put,
               "read_in_store_gb_per_s": base_get, "put_with_spill_gb_per_s": put,
               "read_with_restore_gb_per_s": get, "bad": bad}
        print(json.dumps(row), flush=True)
        rows.append(row)
        assert bad == 0
    med = {k + "_median": statistics.median(r[k] for r in rows)
           for k in ("put_in_store_gb_per_s", "read_in_store_gb_per_s", "put_with_spill_gb_per_s",
                     "read_with_restore_gb_per_s")}
    print(json.dumps({"name": "spill", "store_gib": 1, "gib": a.gib,
                      "drop_caches": a.drop_caches, **med}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
