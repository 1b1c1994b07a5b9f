"""GroupedData: ``Dataset.groupby(key)`` and its aggregations and ``map_groups``.

The rows are range-partitioned by the first key (as sort does), so each group lies in one
partition; each partition is aggregated with pyarrow's hash aggregation (or split into groups
for map_groups) in a reduce task, and the output is sorted by the keys, as Ray's is.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

import numpy as np
import pyarrow as pa

import torus
from torus.data import aggregate as agg
from torus.data import block as B
from torus.data._internal import all_to_all as A
from torus.data._internal.plan import AllToAll


def _spec(a: agg.AggregateFn):
    if a.arrow_fn == "count_all":
        return ([], "count_all")
    if a.options is None:
        return (a.on, a.arrow_fn)
    import pyarrow.compute as pc
    return (a.on, a.arrow_fn, pc.VarianceOptions(**a.options))


def _aggregate_table(t: pa.Table, keys: List[str], aggs: List[agg.AggregateFn]) -> pa.Table:
    """One row per group (no keys: one row) with Ray's aggregation column names."""
    if not keys:  # the whole table is one group
        g = t.append_column("__k", pa.array(np.zeros(t.num_rows, dtype=np.int8)))
        out = g.group_by(["__k"], use_threads=False).aggregate([_spec(a) for a in aggs])
        out = out.select([c for c in out.column_names if c != "__k"])
        return out.rename_columns([a.name for a in aggs])
    if not t.num_rows:
        return t.select(keys)
    out = t.group_by(keys, use_threads=False).aggregate([_spec(a) for a in aggs])
    # pyarrow puts the aggregates first, then the keys: keys first, with Ray's names.
    res = out.select(keys + [c for c in out.column_names if c not in keys])
    return res.rename_columns(keys + [a.name for a in aggs])


@torus.remote(num_returns=2)
def _agg_reduce(keys, aggs, *parts):
    t = _aggregate_table(B.concat(list(parts)), keys, aggs)
    return A._meta(A._sort_table(t, keys, [False] * len(keys)))


@torus.remote(num_returns=2)
def _groups_reduce(keys, fn, batch_format, fn_args, fn_kwargs, *parts):
    t = A._sort_table(B.concat(list(parts)), keys, [False] * len(keys))
    outs = []
    if t.num_rows:
        cols = [t.column(k).to_numpy(zero_copy_only=False) for k in keys]
        change = np.zeros(t.num_rows, dtype=bool)
        change[0] = True
        for c in cols:
            change[1:] |= c[1:] != c[:-1]
        starts = list(np.flatnonzero(change)) + [t.num_rows]
        for a, b in zip(starts[:-1], starts[1:]):
            out = fn(B.to_batch(t.slice(a, b - a), batch_format), *fn_args, **fn_kwargs)
            outs.append(B.from_batch(out))
    return A._meta(B.concat(outs) if outs else pa.table({}))


class GroupedData:
    def __init__(self, ds, key: Union[str, List[str], None]):
        self._ds = ds
        self._keys = A._keys(key)

    def _op(self, name: str, reduce_call) -> Any:
        keys = self._keys

        def run(refs, metas, ctx):
            A._check_columns(metas, keys, "groupby")
            if not refs:
                return [], []
            if not keys:
                return A._finish([reduce_call(*refs)])
            parts = A.range_partition(refs, metas, keys[0], len(refs))
            return A._finish([reduce_call(*p) for p in parts])
        return self._ds._with(AllToAll(name, run))

    def aggregate(self, *aggs: agg.AggregateFn):
        keys = self._keys
        return self._op(f"Aggregate({[a.name for a in aggs]})",
                        lambda *p: _agg_reduce.remote(keys, list(aggs), *p))

    def count(self):
        return self.aggregate(agg.Count())

    def _each(self, cls, on, ignore_nulls=True, **kw):
        cols = [on] if isinstance(on, str) else list(on or [])
        if not cols:
            raise ValueError(f"{cls.__name__.lower()}: give the column(s) to aggregate ('on')")
        return self.aggregate(*[cls(c, ignore_nulls=ignore_nulls, **kw) for c in cols])

    def sum(self, on=None, ignore_nulls: bool = True):
        return self._each(agg.Sum, on, ignore_nulls)

    def min(self, on=None, ignore_nulls: bool = True):
        return self._each(agg.Min, on, ignore_nulls)

    def max(self, on=None, ignore_nulls: bool = True):
        return self._each(agg.Max, on, ignore_nulls)

    def mean(self, on=None, ignore_nulls: bool = True):
        return self._each(agg.Mean, on, ignore_nulls)

    def std(self, on=None, ddof: int = 1, ignore_nulls: bool = True):
        return self._each(agg.Std, on, ignore_nulls, ddof=ddof)

    def map_groups(self, fn: Callable, *, compute=None, batch_format: Optional[str] = "default",
                   fn_args=None, fn_kwargs=None, fn_constructor_args=None,
                   fn_constructor_kwargs=None, num_cpus=None, num_gpus=None, concurrency=None,
                   **ray_remote_args):
        keys = self._keys
        args, kwargs = tuple(fn_args or ()), dict(fn_kwargs or {})
        return self._op(f"MapGroups({getattr(fn, '__name__', type(fn).__name__)})",
                        lambda *p: _groups_reduce.remote(keys, fn, batch_format, args, kwargs, *p))
