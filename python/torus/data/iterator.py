"""DataIterator and the batching every consumer shares (iter_batches, iter_rows,
iter_jax_batches), Ray 2.60's semantics.

Blocks come from a source of Bundles (an execution of a plan, or a streaming_split shard);
a prefetch thread reads the next blocks (``torus.get``: zero-copy for blocks on this node)
while the caller works on the current batch. Batches are cut across block boundaries to
exactly ``batch_size`` rows (the last one shorter unless ``drop_last``); with
``local_shuffle_buffer_size`` rows are drawn at random from a buffer of at least that many.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np
import pyarrow as pa

import torus
from torus.data import block as B

_END = object()


def _table_of(b) -> pa.Table:
    """A bundle's block (zero-copy when it is on this node), cut to its row range if any."""
    t = torus.get(b.ref)
    span = getattr(b, "span", None)
    return t.slice(span[0], span[1] - span[0]) if span is not None else t


def _prefetched(bundles: Iterable, depth: int) -> Iterator[pa.Table]:
    """The blocks' tables, read ``depth`` blocks ahead on a thread (0: on the caller's)."""
    if depth <= 0:
        for b in bundles:
            yield _table_of(b)
        return
    q: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run():
        try:
            for b in bundles:
                t = _table_of(b)
                while not stop.is_set():
                    try:
                        q.put((t, None), timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
        except BaseException as e:
            q.put((None, e))
            return
        q.put((_END, None))

    th = threading.Thread(target=run, name="torus-data-prefetch", daemon=True)
    th.start()
    try:
        while True:
            t, err = q.get()
            if err is not None:
                raise err
            if t is _END:
                return
            yield t
    finally:
        stop.set()
        try:
            while True:
                q.get_nowait()
        except queue.Empty:
            pass


def _shuffled(tables: Iterator[pa.Table], buffer_rows: int, seed: Optional[int]) -> Iterator[pa.Table]:
    rng = np.random.default_rng(seed)
    buf: List[pa.Table] = []
    have = 0
    for t in tables:
        buf.append(t)
        have += t.num_rows
        if have >= 2 * buffer_rows:
            whole = B.concat(buf)
            idx = rng.permutation(whole.num_rows)
            keep = whole.num_rows - buffer_rows
            yield whole.take(pa.array(idx[:keep]))
            buf = [whole.take(pa.array(idx[keep:]))]
            have = buffer_rows
    if have:
        whole = B.concat(buf)
        yield whole.take(pa.array(rng.permutation(whole.num_rows)))


def iter_tables(tables: Iterator[pa.Table], batch_size: Optional[int], drop_last: bool) -> Iterator[pa.Table]:
    """Tables of exactly batch_size rows (None: as they come)."""
    if batch_size is None:
        for t in tables:
            if t.num_rows:
                yield t
        return
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    pending: List[pa.Table] = []
    have = 0
    for t in tables:
        if not t.num_rows:
            continue
        pending.append(t)
        have += t.num_rows
        if have < batch_size:
            continue
        whole = B.concat(pending)
        off = 0
        while have - off >= batch_size:
            yield whole.slice(off, batch_size)
            off += batch_size
        rest = whole.slice(off)
        pending = [rest] if rest.num_rows else []
        have = rest.num_rows
    if have and not drop_last:
        yield B.concat(pending)


def batches(bundles: Iterable, *, batch_size: Optional[int] = 256, batch_format="default",
            drop_last: bool = False, prefetch_batches: int = 1,
            local_shuffle_buffer_size: Optional[int] = None, local_shuffle_seed=None,
            collate_fn: Optional[Callable] = None) -> Iterator[Any]:
    depth = max(1, prefetch_batches) if prefetch_batches else 0
    if getattr(bundles, "prefetches_itself", False):
        depth = 0
    tables = _prefetched(bundles, depth)
    if local_shuffle_buffer_size:
        tables = _shuffled(tables, int(local_shuffle_buffer_size), local_shuffle_seed)
    for t in iter_tables(tables, batch_size, drop_last):
        b = B.to_batch(t, batch_format)
        yield collate_fn(b) if collate_fn is not None else b


class _Opened:
    """One pass over a source, saying whether the source prefetches by itself."""

    def __init__(self, open_bundles: Callable[[], Iterable]):
        self.prefetches_itself = getattr(open_bundles, "prefetches_itself", False)
        self._it = iter(open_bundles())

    def __iter__(self):
        return self._it


class DataIterator:
    """An iterable over a dataset or a shard of it (``Dataset.iterator()``,
    ``streaming_split``, ``ray.train.get_dataset_shard``). Each iteration is one pass (epoch)."""

    def __init__(self, open_bundles: Callable[[], Iterable], name: str = "DataIterator"):
        self._open = open_bundles
        self._name = name

    def iter_batches(self, *, prefetch_batches: int = 1, batch_size: Optional[int] = 256,
                     batch_format: Optional[str] = "default", drop_last: bool = False,
                     local_shuffle_buffer_size: Optional[int] = None,
                     local_shuffle_seed: Optional[int] = None,
                     _collate_fn: Optional[Callable] = None) -> Iterator[Any]:
        if batch_format not in B.BATCH_FORMATS:
            raise ValueError(f"The given batch format {batch_format!r} isn't allowed (must be one "
                             f"of {list(B.BATCH_FORMATS)})")
        return batches(_Opened(self._open), batch_size=batch_size, batch_format=batch_format,
                       drop_last=drop_last, prefetch_batches=prefetch_batches,
                       local_shuffle_buffer_size=local_shuffle_buffer_size,
                       local_shuffle_seed=local_shuffle_seed, collate_fn=_collate_fn)

    def iter_rows(self) -> Iterator[Dict[str, Any]]:
        src = _Opened(self._open)
        for t in _prefetched(src, 0 if src.prefetches_itself else 1):
            yield from B.rows(t)

    def iter_jax_batches(self, *, prefetch_batches: int = 1, batch_size: int = 256,
                         dtypes=None, collate_fn=None, drop_last: bool = False,
                         local_shuffle_buffer_size=None, local_shuffle_seed=None,
                         synchronize_batches: bool = False, paddings=None,
                         sharding=None) -> Iterator[Dict]:
        from torus.data._internal.jax_batches import jax_batches
        return jax_batches(self, batch_size=batch_size, drop_last=drop_last,
                           prefetch_batches=prefetch_batches,
                           local_shuffle_buffer_size=local_shuffle_buffer_size,
                           local_shuffle_seed=local_shuffle_seed, dtypes=dtypes,
                           sharding=sharding, paddings=paddings, collate_fn=collate_fn)

    def materialize(self):
        from torus.data.dataset import MaterializedDataset
        from torus.data._internal.plan import InputBlocks, Plan
        refs, metas = [], []
        for b in self._open():
            refs.append(b.ref)
            metas.append(b.meta)
        return MaterializedDataset(Plan(InputBlocks(self._name, refs, metas)))

    def stats(self) -> str:
        return f"{self._name}: streaming iterator"

    def __iter__(self):
        return self.iter_rows()

    def __repr__(self) -> str:
        return f"DataIterator({self._name})"
