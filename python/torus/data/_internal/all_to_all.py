"""The all-to-all operators (barriers): repartition, random_shuffle, randomize_block_order,
sort, union, zip, and the range partitioning groupby shares with sort.

Each ``*_op`` returns an AllToAll whose ``run(refs, metas, ctx)`` runs on the executor thread
with every input block known: it submits map tasks (one per input block, splitting it into
partitions) and reduce tasks (one per output block), waits for the outputs' metadata and
returns (refs, metas). Blocks move between them through the object store only.
"""
from __future__ import annotations

import random
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import torus
from torus.data import block as B
from torus.data._internal.plan import AllToAll


def _meta(t: pa.Table) -> Tuple[pa.Table, B.BlockMetadata]:
    return t, B.BlockMetadata.of(t)


@torus.remote(num_returns=2)
def _gather(spans: List[Tuple[int, int]], *tables):
    return _meta(B.concat([t.slice(a, b - a) for t, (a, b) in zip(tables, spans)]))


def _finish(pairs: List[Tuple[Any, Any]]) -> Tuple[List[Any], List[Any]]:
    refs = [p[0] for p in pairs]
    metas = torus.get([p[1] for p in pairs])
    return refs, metas


def regroup(refs, metas, counts: Sequence[int]) -> Tuple[List[Any], List[Any]]:
    """The rows of ``refs`` (in order) as blocks of ``counts`` rows each."""
    starts = np.cumsum([0] + [m.num_rows for m in metas])
    pairs = []
    pos = 0
    for c in counts:
        lo, hi = pos, pos + c
        spans, parts = [], []
        for i, r in enumerate(refs):
            a, b = max(lo, starts[i]), min(hi, starts[i + 1])
            if a < b:
                spans.append((int(a - starts[i]), int(max(a, b) - starts[i])))
                parts.append(r)
        pairs.append(_gather.remote(spans, *parts))
        pos = hi
    return _finish(pairs)


def repartition_op(n: int, shuffle: bool) -> AllToAll:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"repartition: num_blocks must be a positive int, got {n!r}")
    if shuffle:
        op = random_shuffle_op(None, n)
        op.name = f"Repartition(num_blocks={n}, shuffle=True)"
        return op

    def run(refs, metas, ctx):
        total = sum(m.num_rows for m in metas)
        counts = [total * (i + 1) // n - total * i // n for i in range(n)]
        return regroup(refs, metas, counts)
    return AllToAll(f"Repartition(num_blocks={n})", run)


@torus.remote
def _shuffle_map(t: pa.Table, n: int, seed):
    rng = np.random.default_rng(seed)
    which = rng.integers(0, n, t.num_rows)
    parts = [t.filter(pa.array(which == j)) for j in range(n)]
    return parts[0] if n == 1 else tuple(parts)


@torus.remote(num_returns=2)
def _shuffle_reduce(seed, *parts):
    t = B.concat(list(parts))
    rng = np.random.default_rng(seed)
    return _meta(t.take(pa.array(rng.permutation(t.num_rows))) if t.num_rows else t)


def _seeds(seed: Optional[int], n: int) -> List[Optional[int]]:
    if seed is None:
        return [None] * n
    return [seed * 1_000_003 + i for i in range(n)]


def random_shuffle_op(seed: Optional[int], n_out: Optional[int] = None) -> AllToAll:
    def run(refs, metas, ctx):
        if not refs:
            return [], []
        n = n_out or len(refs)
        maps = [_shuffle_map.options(num_returns=n).remote(r, n, s)
                for r, s in zip(refs, _seeds(seed, len(refs)))]
        maps = [[m] if n == 1 else m for m in maps]
        rs = _seeds(None if seed is None else seed + 7, n)
        return _finish([_shuffle_reduce.remote(rs[j], *[m[j] for m in maps]) for j in range(n)])
    return AllToAll("RandomShuffle", run)


def randomize_blocks_op(seed: Optional[int]) -> AllToAll:
    def run(refs, metas, ctx):
        order = list(range(len(refs)))
        random.Random(seed).shuffle(order)
        return [refs[i] for i in order], [metas[i] for i in order]
    return AllToAll("RandomizeBlockOrder", run)


# ------------------------------------------------------------------------------ sort
def _keys(key) -> List[str]:
    if key is None:
        return []
    return [key] if isinstance(key, str) else list(key)


@torus.remote
def _sample(t: pa.Table, col: str, k: int):
    if not t.num_rows:
        return []
    idx = np.random.default_rng(0).choice(t.num_rows, min(k, t.num_rows), replace=False)
    return [v for v in t.column(col).take(pa.array(np.sort(idx))).to_pylist() if v is not None]


def _partition_index(t: pa.Table, col: str, bounds: list) -> np.ndarray:
    vals = t.column(col).to_numpy(zero_copy_only=False)
    if not bounds:
        return np.zeros(t.num_rows, dtype=np.int64)
    b = np.array(bounds, dtype=vals.dtype if vals.dtype != object else object)
    nulls = pc.is_null(t.column(col)).to_numpy(zero_copy_only=False)
    idx = np.searchsorted(b, np.where(nulls, b[-1], vals) if nulls.any() else vals, side="right")
    idx[nulls] = len(bounds)   # nulls sort last
    return idx


@torus.remote
def _range_map(t: pa.Table, col: str, bounds: list, n: int):
    idx = _partition_index(t, col, bounds)
    parts = [t.filter(pa.array(idx == j)) for j in range(n)]
    return parts[0] if n == 1 else tuple(parts)


def _sort_table(t: pa.Table, keys: List[str], desc: List[bool]) -> pa.Table:
    if not t.num_rows or not keys:
        return t
    order = [(k, "descending" if d else "ascending") for k, d in zip(keys, desc)]
    return t.sort_by(order)


@torus.remote(num_returns=2)
def _sort_reduce(keys, desc, *parts):
    return _meta(_sort_table(B.concat(list(parts)), keys, desc))


def range_partition(refs, metas, col: str, n: int) -> List[List[Any]]:
    """Partitions of the rows by ranges of ``col`` (ascending, nulls last): for each of the
    ``n`` ranges the list of parts (one per input block)."""
    samples = torus.get([_sample.remote(r, col, 20) for r in refs])
    vals = sorted(v for s in samples for v in s)
    bounds = [vals[len(vals) * i // n] for i in range(1, n)] if vals else []
    bounds = sorted(set(bounds))
    n_parts = len(bounds) + 1
    maps = [_range_map.options(num_returns=n_parts).remote(r, col, bounds, n_parts) for r in refs]
    maps = [[m] if n_parts == 1 else m for m in maps]
    return [[m[j] for m in maps] for j in range(n_parts)]


def sort_op(key, descending) -> AllToAll:
    keys = _keys(key)
    if not keys:
        raise ValueError("sort: a key (a column name or a list of them) is required")
    desc = list(descending) if isinstance(descending, (list, tuple)) else [bool(descending)] * len(keys)
    if len(desc) != len(keys):
        raise ValueError(f"sort: descending has {len(desc)} entries for {len(keys)} keys")

    def run(refs, metas, ctx):
        _check_columns(metas, keys, "sort")
        if not refs:
            return [], []
        parts = range_partition(refs, metas, keys[0], len(refs))
        if desc[0]:
            parts = parts[::-1]
        return _finish([_sort_reduce.remote(keys, desc, *p) for p in parts])
    return AllToAll(f"Sort(key={keys})", run)


def _check_columns(metas, cols: List[str], what: str) -> None:
    for m in metas:
        if m.schema is not None and m.num_rows:
            missing = [c for c in cols if c not in m.schema.names]
            if missing:
                raise ValueError(f"{what}: the key column(s) {missing} are not in the dataset "
                                 f"(columns: {m.schema.names})")
            return


# ------------------------------------------------------------------------------ union, zip
def _run_plan(plan, ctx) -> Tuple[List[Any], List[Any]]:
    from torus.data._internal.executor import Execution
    ex = Execution(plan, ctx, show_progress=False)
    refs, metas = [], []
    for b in ex.bundles():
        refs.append(b.ref)
        metas.append(b.meta)
    return refs, metas


def union_op(plans) -> AllToAll:
    def run(refs, metas, ctx):
        refs, metas = list(refs), list(metas)
        for p in plans:
            r, m = _run_plan(p, ctx)
            refs += r
            metas += m
        return refs, metas
    return AllToAll("Union", run)


@torus.remote(num_returns=2)
def _zip_blocks(left: pa.Table, *rights):
    t = left
    for r in rights:
        for i, name in enumerate(r.column_names):
            new = name
            k = 1
            while new in t.column_names:
                new = f"{name}_{k}"
                k += 1
            t = t.append_column(new, r.column(i))
    return _meta(t)


def zip_op(plans) -> AllToAll:
    def run(refs, metas, ctx):
        counts = [m.num_rows for m in metas]
        others = []
        for p in plans:
            r, m = _run_plan(p, ctx)
            total = sum(x.num_rows for x in m)
            if total != sum(counts):
                raise ValueError(f"Cannot zip datasets of different number of rows: "
                                 f"{sum(counts)}, {total}")
            others.append(regroup(r, m, counts)[0])
        return _finish([_zip_blocks.remote(refs[i], *[o[i] for o in others])
                        for i in range(len(refs))])
    return AllToAll("Zip", run)
