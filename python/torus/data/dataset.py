"""Dataset: Ray Data's lazy, streaming dataset (Ray 2.60 names and semantics).

A Dataset is a logical plan (``_internal/plan.py``); transformations return new Datasets and
run nothing. Consuming one (iterating, take, count, write, materialize) runs the plan on the
streaming executor (``_internal/executor.py``). ``MaterializedDataset`` holds its blocks in the
object store and re-reads them on every consumption.
"""
from __future__ import annotations

import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import pyarrow as pa

import torus
from torus.data import block as B
from torus.data._internal import all_to_all as A
from torus.data._internal.executor import Execution
from torus.data._internal.plan import InputBlocks, Limit, MapSpec, Plan, Read
from torus.data.context import DataContext
from torus.data.dataset_consume import ConsumeMixin


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _pool_of(fn, concurrency, compute) -> Tuple[Optional[Tuple[int, int]], Optional[int]]:
    """(actor pool bounds, task concurrency) for map_batches' compute arguments."""
    if compute is not None and hasattr(compute, "min_size"):
        return (compute.min_size, compute.max_size), None
    is_class = isinstance(fn, type)
    if concurrency is None:
        if is_class:
            raise ValueError("``concurrency`` must be specified when using a callable class. "
                             "For example, use ``concurrency=n`` for a pool of ``n`` workers.")
        return None, None
    if isinstance(concurrency, tuple):
        if len(concurrency) != 2 or concurrency[0] > concurrency[1] or concurrency[0] < 1:
            raise ValueError(f"``concurrency`` tuple must be (min, max) with 1 <= min <= max, "
                             f"got {concurrency}")
        if not is_class:
            raise ValueError("``concurrency`` as a (min, max) tuple is for callable classes")
        return (int(concurrency[0]), int(concurrency[1])), None
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"``concurrency`` must be a positive int or a (min, max) tuple, "
                         f"got {concurrency!r}")
    return ((concurrency, concurrency), None) if is_class else (None, concurrency)


def _remote_args(num_cpus=None, num_gpus=None, resources=None, memory=None, **rest) -> Dict:
    resources = resources or rest.pop("resources", None)
    out = {k: v for k, v in rest.items() if v is not None}
    if num_cpus is not None:
        out["num_cpus"] = num_cpus
    if num_gpus is not None:
        out["num_gpus"] = num_gpus
    if resources:
        out["resources"] = resources
    if memory is not None:
        out["memory"] = memory
    return out


class Dataset(ConsumeMixin):
    def __init__(self, plan: Plan):
        self._plan = plan
        self._uuid = uuid.uuid4().hex[:8]
        self._last_stats: Optional[str] = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def _from_read(cls, name: str, tasks: List[Any], *, ray_remote_args: Optional[dict] = None,
                   concurrency: Optional[int] = None) -> "Dataset":
        return cls(Plan(Read(name, list(tasks), dict(ray_remote_args or {}), concurrency)))

    @classmethod
    def _from_blocks(cls, name: str, tables: List[pa.Table]) -> "MaterializedDataset":
        torus._private.worker.ensure_initialized() if hasattr(torus, "_private") else None
        refs = [torus.put(t) for t in tables]
        metas = [B.BlockMetadata.of(t) for t in tables]
        return MaterializedDataset(Plan(InputBlocks(name, refs, metas)))

    def _with(self, op) -> "Dataset":
        return Dataset(self._plan.with_op(op))

    def _execute(self, show_progress: Optional[bool] = None) -> Execution:
        torus._private.worker.ensure_initialized()
        return Execution(self._plan, DataContext.get_current().copy(), show_progress=show_progress)

    # ---------------------------------------------------------------- one-to-one transforms
    def map(self, fn: Callable, *, compute=None, fn_args=None, fn_kwargs=None,
            fn_constructor_args=None, fn_constructor_kwargs=None, num_cpus=None, num_gpus=None,
            memory=None, concurrency=None, ray_remote_args_fn=None, **ray_remote_args) -> "Dataset":
        return self._udf("map_rows", "Map", fn, compute, fn_args, fn_kwargs, fn_constructor_args,
                         fn_constructor_kwargs, concurrency,
                         _remote_args(num_cpus, num_gpus, ray_remote_args.pop("resources", None),
                                      memory, **ray_remote_args))

    def flat_map(self, fn: Callable, *, compute=None, fn_args=None, fn_kwargs=None,
                 fn_constructor_args=None, fn_constructor_kwargs=None, num_cpus=None,
                 num_gpus=None, memory=None, concurrency=None, ray_remote_args_fn=None,
                 **ray_remote_args) -> "Dataset":
        return self._udf("flat_map", "FlatMap", fn, compute, fn_args, fn_kwargs,
                         fn_constructor_args, fn_constructor_kwargs, concurrency,
                         _remote_args(num_cpus, num_gpus, ray_remote_args.pop("resources", None),
                                      memory, **ray_remote_args))

    def filter(self, fn: Optional[Callable] = None, expr: Optional[str] = None, *, compute=None,
               fn_args=None, fn_kwargs=None, fn_constructor_args=None,
               fn_constructor_kwargs=None, num_cpus=None, num_gpus=None, memory=None,
               concurrency=None, ray_remote_args_fn=None, **ray_remote_args) -> "Dataset":
        if (fn is None) == (expr is None):
            raise ValueError("Exactly one of 'fn' or 'expr' must be provided.")
        if expr is not None:
            return self._filter_expr(expr)
        return self._udf("filter", "Filter", fn, compute, fn_args, fn_kwargs,
                         fn_constructor_args, fn_constructor_kwargs, concurrency,
                         _remote_args(num_cpus, num_gpus, ray_remote_args.pop("resources", None),
                                      memory, **ray_remote_args))

    def _filter_expr(self, expr) -> "Dataset":
        from torus.data.expressions import Expr
        if isinstance(expr, Expr):
            import pyarrow.compute as pc

            def pred(t):
                return pc.fill_null(expr.eval(t), False)
        else:
            from torus.data._internal.expressions import compile_filter
            pred = compile_filter(expr)
        return self.map_batches(lambda t: t.filter(pred(t)), batch_format="pyarrow",
                                batch_size=None)

    def with_column(self, column_name: str, expr, **ray_remote_args) -> "Dataset":
        """A column computed from an expression (``ray.data.expressions``) per block."""
        from torus.data.expressions import evaluate_column

        def add(t):
            v = evaluate_column(expr, t)
            i = t.schema.get_field_index(column_name)
            return t.set_column(i, column_name, v) if i >= 0 else t.append_column(column_name, v)
        return self.map_batches(add, batch_format="pyarrow", batch_size=None, **ray_remote_args)

    def map_batches(self, fn, *, batch_size: Union[int, None, str] = "default", compute=None,
                    batch_format: Optional[str] = "default", zero_copy_batch: bool = False,
                    fn_args=None, fn_kwargs=None, fn_constructor_args=None,
                    fn_constructor_kwargs=None, num_cpus=None, num_gpus=None, memory=None,
                    concurrency=None, ray_remote_args_fn=None, **ray_remote_args) -> "Dataset":
        if batch_format not in B.BATCH_FORMATS and batch_format is not None:
            raise ValueError(f"The batch format must be one of {list(B.BATCH_FORMATS)}, got "
                             f"{batch_format!r}")
        if batch_size is not None and batch_size != "default" and (
                not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, None or 'default', got "
                             f"{batch_size!r}")
        if num_gpus and batch_size == "default":
            raise ValueError("batch_size must be provided to map_batches when requesting GPUs")
        return self._udf("map_batches", "MapBatches", fn, compute, fn_args, fn_kwargs,
                         fn_constructor_args, fn_constructor_kwargs, concurrency,
                         _remote_args(num_cpus, num_gpus, ray_remote_args.pop("resources", None),
                                      memory, **ray_remote_args),
                         batch_size=batch_size, batch_format=batch_format,
                         zero_copy_batch=zero_copy_batch)

    def _udf(self, kind, label, fn, compute, fn_args, fn_kwargs, ctor_args, ctor_kwargs,
             concurrency, remote_args, **extra) -> "Dataset":
        if not callable(fn):
            raise ValueError(f"{label} expects a function or a callable class, got {fn!r:.100}")
        if (ctor_args or ctor_kwargs) and not isinstance(fn, type):
            raise ValueError("fn_constructor_args and fn_constructor_kwargs can only be "
                             "specified if providing a callable class instance for fn")
        pool, conc = _pool_of(fn, concurrency, compute)
        spec = MapSpec(kind=kind, fn=fn, name=f"{label}({_fn_name(fn)})",
                       fn_args=tuple(fn_args or ()), fn_kwargs=dict(fn_kwargs or {}),
                       fn_constructor_args=tuple(ctor_args or ()),
                       fn_constructor_kwargs=dict(ctor_kwargs or {}), pool=pool,
                       concurrency=conc, ray_remote_args=remote_args, **extra)
        return self._with(spec)

    def add_column(self, col: str, fn: Callable, *, batch_format: Optional[str] = "pandas",
                   compute=None, concurrency=None, **ray_remote_args) -> "Dataset":
        def add(batch):
            value = fn(batch)
            if batch_format == "pyarrow":
                arr = value if isinstance(value, (pa.Array, pa.ChunkedArray)) else \
                    B.numpy_to_column(value)
                i = batch.schema.get_field_index(col)
                return batch.set_column(i, col, arr) if i >= 0 else batch.append_column(col, arr)
            batch[col] = value
            return batch
        return self.map_batches(add, batch_format=batch_format, batch_size=None,
                                compute=compute, concurrency=concurrency, **ray_remote_args)

    def drop_columns(self, cols: List[str], *, compute=None, concurrency=None,
                     **ray_remote_args) -> "Dataset":
        cols = [cols] if isinstance(cols, str) else list(cols)
        if len(set(cols)) != len(cols):
            raise ValueError(f"drop_columns expects unique column names, got: {cols}")
        return self.map_batches(lambda t: t.drop_columns(cols), batch_format="pyarrow",
                                batch_size=None, zero_copy_batch=True, concurrency=concurrency,
                                **ray_remote_args)

    def select_columns(self, cols: Union[str, List[str]], *, compute=None, concurrency=None,
                       **ray_remote_args) -> "Dataset":
        cols = [cols] if isinstance(cols, str) else list(cols)
        if len(set(cols)) != len(cols):
            raise ValueError(f"select_columns expected unique column names, got: {cols}")
        return self.map_batches(lambda t: t.select(cols), batch_format="pyarrow",
                                batch_size=None, zero_copy_batch=True, concurrency=concurrency,
                                **ray_remote_args)

    def rename_columns(self, names: Union[List[str], Dict[str, str]], *, concurrency=None,
                       **ray_remote_args) -> "Dataset":
        if isinstance(names, dict):
            mapping = dict(names)

            def ren(t):
                missing = [k for k in mapping if k not in t.column_names]
                if missing:
                    raise ValueError(f"rename_columns: columns {missing} not in the dataset "
                                     f"(columns: {t.column_names})")
                return t.rename_columns([mapping.get(c, c) for c in t.column_names])
        else:
            new = list(names)

            def ren(t):
                return t.rename_columns(new)
        return self.map_batches(ren, batch_format="pyarrow", batch_size=None,
                                zero_copy_batch=True, concurrency=concurrency, **ray_remote_args)

    def limit(self, limit: int) -> "Dataset":
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative int, got {limit!r}")
        return self._with(Limit(limit))

    # ---------------------------------------------------------------- all-to-all
    def repartition(self, num_blocks: int, *, shuffle: bool = False, keys=None,
                    sort: bool = False) -> "Dataset":
        return self._with(A.repartition_op(num_blocks, shuffle))

    def random_shuffle(self, *, seed: Optional[int] = None, num_blocks=None,
                       **ray_remote_args) -> "Dataset":
        return self._with(A.random_shuffle_op(seed))

    def randomize_block_order(self, *, seed: Optional[int] = None) -> "Dataset":
        return self._with(A.randomize_blocks_op(seed))

    def sort(self, key: Union[str, List[str]], descending: Union[bool, List[bool]] = False,
             boundaries=None) -> "Dataset":
        return self._with(A.sort_op(key, descending))

    def groupby(self, key: Union[str, List[str], None], num_partitions=None):
        from torus.data.grouped_data import GroupedData
        return GroupedData(self, key)

    def aggregate(self, *aggs) -> Dict[str, Any]:
        """Whole-dataset aggregations: ``{name: value}`` (``ds.aggregate(Count(), Sum("x"))``)."""
        from torus.data.grouped_data import GroupedData
        rows = GroupedData(self, None).aggregate(*aggs).take_all()
        return rows[0] if rows else {a.name: None for a in aggs}

    def _global(self, cls, on, **kw):
        from torus.data import aggregate as agg
        cols = [on] if isinstance(on, str) else list(on or [])
        if not cols:
            raise ValueError(f"{cls.__name__.lower()}: give the column(s) to aggregate ('on')")
        out = self.aggregate(*[getattr(agg, cls.__name__)(c, **kw) for c in cols])
        return next(iter(out.values())) if isinstance(on, str) else out

    def sum(self, on=None, ignore_nulls: bool = True):
        from torus.data.aggregate import Sum
        return self._global(Sum, on, ignore_nulls=ignore_nulls)

    def min(self, on=None, ignore_nulls: bool = True):
        from torus.data.aggregate import Min
        return self._global(Min, on, ignore_nulls=ignore_nulls)

    def max(self, on=None, ignore_nulls: bool = True):
        from torus.data.aggregate import Max
        return self._global(Max, on, ignore_nulls=ignore_nulls)

    def mean(self, on=None, ignore_nulls: bool = True):
        from torus.data.aggregate import Mean
        return self._global(Mean, on, ignore_nulls=ignore_nulls)

    def std(self, on=None, ddof: int = 1, ignore_nulls: bool = True):
        from torus.data.aggregate import Std
        return self._global(Std, on, ddof=ddof, ignore_nulls=ignore_nulls)

    def unique(self, column: str) -> List[Any]:
        rows = self.select_columns([column]).groupby(column).count().take_all()
        return [r[column] for r in rows]

    def union(self, *other: "Dataset") -> "Dataset":
        return self._with(A.union_op([o._plan for o in other]))

    def zip(self, *other: "Dataset") -> "Dataset":
        return self._with(A.zip_op([o._plan for o in other]))

    # ---------------------------------------------------------------- materialize
    def materialize(self) -> "MaterializedDataset":
        ex = self._execute()
        refs, metas = [], []
        for b in ex.bundles():
            refs.append(b.ref)
            metas.append(b.meta)
        self._last_stats = _stats_text(ex)
        out = MaterializedDataset(Plan(InputBlocks(self._plan.source.name, refs, metas)))
        out._last_stats = self._last_stats
        return out

    def _schema_hint(self):
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={'->'.join(self._plan.names())})"


def _stats_text(ex: Execution) -> str:
    lines = []
    for i, s in enumerate(ex.stages):
        lines.append(f"Operator {i} {s.name}: {s.blocks_out} blocks produced, {s.rows_out} rows "
                     f"output, {s.busy_s:.3f}s in tasks")
    lines.append(f"Dataset throughput: {ex.wall_s:.3f}s wall time, peak object store use "
                 f"{ex.peak_bytes / 2**20:.1f} MiB (budget {ex.budget / 2**20:.0f} MiB)")
    return "\n".join(lines)


class MaterializedDataset(Dataset):
    """A Dataset whose blocks are in the object store (materialize(), from_* sources)."""

    def num_blocks(self) -> int:
        return len(self._plan.source.refs) if not self._plan.ops else super().num_blocks()
