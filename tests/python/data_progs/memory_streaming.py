"""Streaming in bounded memory (Ray Data docs "Key concepts" > streaming execution, "Execution
configurations" > backpressure; issue #43's "Done when"): with a 256 MiB object store, a
map_batches pipeline producing 1.5 GiB (6x the store) streams through iter_batches: every row
is seen once with the right contents, the driver's resident memory grows by less than 1 GiB,
the object store is never used beyond its size and nothing is spilled to disk. The store and
spill figures come from what each system offers: on Torus `torus status` (object store
used / capacity, bytes spilled now), on Ray memory_summary(stats_only=True) (plasma usage,
bytes spilled so far), and on both the spill directory given to ray.init: sampled, and watched
with inotify (nothing is ever created in it). Prints the figures."""
import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import ray

STORE = 256 << 20
ROW_FLOATS = 16384                   # 128 KiB per row
ROWS = 12288                         # 1.5 GiB in all
BLOCKS = 192                         # 8 MiB blocks
ON_TORUS = ray.__name__ == "torus"   # `python -m torus.ray` maps ray to torus
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def rss_kib() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssShmem", "RssFile")):
                key, val = line.split(":")
                out[key] = int(val.split()[0])
    return out


def to_bytes(num: str, unit: str) -> int:
    return int(float(num) * UNITS[unit])


class CreationWatch:
    """Counts files and directories created under `root` (and its subdirectories existing
    now) from now on, with inotify: a spill however brief leaves a creation event."""

    IN_MOVED_TO, IN_CREATE = 0x80, 0x100

    def __init__(self, root: str):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, ctypes.get_errno()
        for d, _, _ in os.walk(root):
            wd = self.libc.inotify_add_watch(self.fd, d.encode(),
                                             self.IN_CREATE | self.IN_MOVED_TO)
            assert wd >= 0, (d, ctypes.get_errno())

    def created(self) -> list:
        names = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            off = 0
            while off < len(buf):
                _, _, _, size = struct.unpack_from("iIII", buf, off)
                names.append(buf[off + 16:off + 16 + size].rstrip(b"\0").decode())
                off += 16 + size
        return names

    def close(self):
        os.close(self.fd)


class StoreProbe:
    """Samples the object store's use and spilling while the pipeline runs."""

    def __init__(self, ctx, spill_dir: str):
        self.spill_dir = spill_dir
        self.used = []
        self.capacity = 0
        self.spilled = 0
        self.spill_files = 0
        self.error = None
        self.addr = ray.get_runtime_context().gcs_address
        if ON_TORUS:
            session = ctx.address_info["session_dir"]
            with open(os.path.join(session, "token")) as f:
                self.env = dict(os.environ, TORUS_TOKEN=f.read().strip())
            self.torus = os.path.join(os.path.dirname(sys.executable), "torus")

    def sample(self):
        if ON_TORUS:
            out = subprocess.run([self.torus, "status", "--address", self.addr], env=self.env,
                                 capture_output=True, text=True, timeout=20).stdout
            m = re.search(r"object store\s+([\d.]+) (\w+) / ([\d.]+) (\w+), ([\d.]+) (\w+) "
                          r"spilled", out)
            assert m, out
            self.used.append(to_bytes(m[1], m[2]))
            self.capacity = to_bytes(m[3], m[4])
            self.spilled = max(self.spilled, to_bytes(m[5], m[6]))
        else:
            from ray._private.internal_api import memory_summary
            out = memory_summary(address=self.addr, stats_only=True)
            m = re.search(r"Plasma memory usage (\d+) MiB", out)
            assert m, out
            self.used.append(int(m[1]) << 20)
            self.capacity = int(ray.cluster_resources()["object_store_memory"])
            s = re.search(r"Spilled (\d+) MiB", out)
            self.spilled = max(self.spilled, int(s[1]) << 20 if s else 0)
        for _, _, files in os.walk(self.spill_dir):
            self.spill_files = max(self.spill_files, len(files))

    def run(self, stop: threading.Event):
        try:
            while not stop.is_set():
                self.sample()
                stop.wait(0.25)
            self.sample()
        except Exception as e:  # reported by the main thread
            self.error = e


def make_rows(batch):
    ids = batch["id"]
    x = np.empty((len(ids), ROW_FLOATS), dtype=np.float64)
    x[:] = ids[:, None]
    return {"id": ids, "x": x}


def main():
    spill = tempfile.mkdtemp(prefix="spill-")
    ctx = ray.init(num_cpus=2, object_store_memory=STORE, object_spilling_directory=spill)
    probe = StoreProbe(ctx, spill)
    watch = CreationWatch(spill)
    base = rss_kib()
    peak = dict(base)
    stop = threading.Event()
    sampler = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    sampler.start()
    started = time.monotonic()
    seen = 0
    id_sum = 0
    ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(make_rows)
    for batch in ds.iter_batches(batch_size=256):
        x, ids = batch["x"], batch["id"]
        assert x.shape[1] == ROW_FLOATS and (x[:, 0] == ids).all() and (x[:, -1] == ids).all()
        seen += len(ids)
        id_sum += int(ids.sum())
        now = rss_kib()
        peak = {k: max(peak[k], v) for k, v in now.items()}
    took = time.monotonic() - started
    stop.set()
    sampler.join(timeout=60)
    assert probe.error is None, repr(probe.error)
    created = watch.created()
    watch.close()
    gib = ROWS * ROW_FLOATS * 8 / (1 << 30)
    growth = (peak["VmRSS"] - base["VmRSS"]) << 10
    print(f"streamed {seen} rows, {gib:.2f} GiB through a {STORE >> 20} MiB store in "
          f"{took:.1f} s ({gib / took:.2f} GiB/s)")
    print(f"driver RSS: base {base['VmRSS'] >> 10} MiB, peak {peak['VmRSS'] >> 10} MiB "
          f"(growth {growth >> 20} MiB; peak anon {peak['RssAnon'] >> 10} MiB, "
          f"shmem {peak['RssShmem'] >> 10} MiB)")
    print(f"object store: capacity {probe.capacity >> 20} MiB, peak used "
          f"{max(probe.used) >> 20} MiB over {len(probe.used)} samples; spilled "
          f"{probe.spilled} B; spill files seen {probe.spill_files}, created {len(created)}")
    assert seen == ROWS and id_sum == ROWS * (ROWS - 1) // 2, (seen, id_sum)
    assert growth < 1 << 30, growth
    assert len(probe.used) >= 3, probe.used
    assert probe.capacity <= STORE * 1.01 and max(probe.used) <= probe.capacity, probe.used
    assert probe.spilled == 0 and probe.spill_files == 0, (probe.spilled, probe.spill_files)
    assert not created, created[:10]
    ray.shutdown()
    shutil.rmtree(spill, ignore_errors=True)
    print("OK")


if __name__ == "__main__":
    main()
