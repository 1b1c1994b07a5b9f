"""A 256 MiB numpy array through the shared-memory store, read back without a second copy.

A copy would show in the reader's anonymous resident memory (RssAnon); the store's pages are
shared memory (RssShmem), so the reader's RssAnon must not grow by anything near 256 MiB.
"""
import gc

import numpy as np
import pytest

import torus

from helpers import rss_kib

MiB = 1 << 20
SIZE = 256 * MiB


@torus.remote
def read_in_worker(arr):
    from helpers import rss_kib as rss
    before = rss("self", "RssAnon")
    total = float(arr.sum(dtype=np.float64))   # touches every page
    after = rss("self", "RssAnon")
    return total, arr.flags.writeable, arr.nbytes, (after - before) * 1024, rss("self", "RssAnon") * 1024


def test_256_mib_array_zero_copy(torus_local):
    n = SIZE // 8
    a = np.ones(n, dtype=np.float64)
    ref = torus.put(a)
    del a
    gc.collect()

    before = rss_kib("self", "RssAnon") * 1024
    out = torus.get(ref)
    total = float(out.sum(dtype=np.float64))
    after = rss_kib("self", "RssAnon") * 1024
    assert total == float(n)
    assert not out.flags.writeable
    assert out.nbytes == SIZE
    assert after - before < 64 * MiB, f"reader's RssAnon grew by {(after - before) / MiB:.0f} MiB"
    # A second get is a second view of the same memory.
    out2 = torus.get(ref)
    assert out2.__array_interface__["data"][0] == out.__array_interface__["data"][0]
    del out, out2

    total, writeable, nbytes, grew, anon = torus.get(read_in_worker.remote(ref), timeout=300)
    assert total == float(n) and not writeable and nbytes == SIZE
    assert grew < 64 * MiB, f"worker's RssAnon grew by {grew / MiB:.0f} MiB reading the array"
    assert anon < SIZE, f"worker holds {anon / MiB:.0f} MiB of anonymous memory"


def test_view_outlives_ref(torus_local):
    """The array keeps the store's memory alive after its ObjectRef is gone."""
    ref = torus.put(np.arange(1 << 20, dtype=np.int64))
    arr = torus.get(ref)
    del ref
    gc.collect()
    torus.get(torus.put(np.zeros(1 << 20)))   # reuse pressure on the store
    assert arr[12345] == 12345 and arr[-1] == (1 << 20) - 1


@torus.remote
class Maker:
    """Returns a large array and reports how far its process's resident memory peaked."""

    def make(self, nbytes):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (the peak) to the current resident size
        from helpers import rss_kib as rss
        self.base_kib = rss("self", "VmRSS")
        return np.ones(nbytes, dtype=np.uint8)

    def peak_growth(self):
        from helpers import rss_kib as rss
        return (rss("self", "VmHWM") - self.base_kib) * 1024


def test_large_return_value_is_copied_once_into_the_store(torus_local):
    # The array's memory goes straight into the shared-memory store: its pages (64 MiB) plus
    # the store's (64 MiB). Joining it in Python and copying it again in the core (the path
    # before) made three anonymous copies at once, 192 MiB before the store's.
    nbytes = 64 * MiB
    m = Maker.remote()
    out = torus.get(m.make.remote(nbytes), timeout=300)
    assert out.nbytes == nbytes and int(out[0]) == 1 and int(out[-1]) == 1
    assert not out.flags.writeable       # read back as a view of the store
    grew = torus.get(m.peak_growth.remote())
    assert grew < 160 * MiB, f"the worker's resident memory peaked {grew / MiB:.0f} MiB higher"
    del out
    torus.kill(m)
