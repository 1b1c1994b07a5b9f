"""Splitting a materialized dataset by rows: split(n, equal), split_at_indices,
split_proportionately, train_test_split. Blocks are cut where a split boundary falls inside
one (a task per cut block); whole blocks are shared, not copied."""
from __future__ import annotations

from typing import Any, List, Sequence

from torus.data._internal import all_to_all as A
from torus.data._internal.plan import InputBlocks, Plan


def _piece(refs, metas, lo: int, hi: int):
    """A MaterializedDataset of rows [lo, hi)."""
    from torus.data.dataset import MaterializedDataset
    out_refs, out_metas = [], []
    start = 0
    for r, m in zip(refs, metas):
        end = start + m.num_rows
        a, b = max(lo, start), min(hi, end)
        if a < b:
            if a == start and b == end:
                out_refs.append(r)
                out_metas.append(m)
            else:
                rr, mm = A._finish([A._gather.remote([(a - start, b - start)], r)])
                out_refs += rr
                out_metas += mm
        start = end
    return MaterializedDataset(Plan(InputBlocks("Split", out_refs, out_metas)))


def _cut(ds, bounds: Sequence[int]) -> List[Any]:
    src = ds._plan.source
    return [_piece(src.refs, src.metas, a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _total(ds) -> int:
    return sum(m.num_rows for m in ds._plan.source.metas)


def split(ds, n: int, equal: bool) -> List[Any]:
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"The number of splits {n} is not positive.")
    total = _total(ds)
    if equal:
        each = total // n
        return _cut(ds, [each * i for i in range(n + 1)])
    src = ds._plan.source
    if len(src.refs) >= n:  # whole blocks, balanced by rows
        from torus.data.dataset import MaterializedDataset
        groups: List[List[int]] = [[] for _ in range(n)]
        rows = [0] * n
        for i, m in enumerate(src.metas):
            j = min(range(n), key=lambda k: (rows[k], k))
            groups[j].append(i)
            rows[j] += m.num_rows
        return [MaterializedDataset(Plan(InputBlocks("Split", [src.refs[i] for i in sorted(g)],
                                                     [src.metas[i] for i in sorted(g)])))
                for g in groups]
    return _cut(ds, [total * i // n for i in range(n + 1)])


def split_at_indices(ds, indices: List[int]) -> List[Any]:
    if len(indices) < 1:
        raise ValueError("indices must be at least of length 1")
    if sorted(indices) != list(indices):
        raise ValueError("indices must be sorted")
    if indices[0] < 0:
        raise ValueError("indices must be positive")
    total = _total(ds)
    bounds = [0] + [min(i, total) for i in indices] + [total]
    return _cut(ds, bounds)


def split_proportionately(ds, proportions: List[float]) -> List[Any]:
    if not proportions or any(p <= 0 for p in proportions) or sum(proportions) >= 1:
        raise ValueError("proportions must be positive and sum to less than 1")
    total = _total(ds)
    idx, acc = [], 0.0
    for p in proportions:
        acc += p
        idx.append(int(total * acc))
    return split_at_indices(ds, idx)


def train_test_split(ds, test_size) -> List[Any]:
    total = _total(ds)
    if isinstance(test_size, float):
        if not 0 < test_size < 1:
            raise ValueError(f"If `test_size` is a float, it must be bigger than 0 and smaller "
                             f"than 1. Got {test_size}.")
        n_test = int(round(total * test_size))
    else:
        if test_size <= 0 or test_size >= total:
            raise ValueError(f"If `test_size` is an int, it must be bigger than 0 and smaller "
                             f"than the size of the dataset ({total}). Got {test_size}.")
        n_test = int(test_size)
    return split_at_indices(ds, [total - n_test])
