"""The work of read and map tasks, run on workers: a source's tables streamed through a chain
of fused MapSpecs, the result cut into the number of blocks the driver asked for.

``run_chain(source, chain, num_blocks)`` returns ``num_blocks`` tables followed by the list of
their BlockMetadata (the task's last return, fetched by the driver; the blocks stay in the
store). Callable classes are constructed once per process and reused (actor pools hold them).
"""
from __future__ import annotations

import inspect
import time
from typing import Any, Dict, Iterable, Iterator, List

import pyarrow as pa

from torus.data import block as B
from torus.data._internal.plan import MapSpec

DEFAULT_BATCH_SIZE = 1024
_instances: Dict[int, Any] = {}   # id(MapSpec as unpickled here) -> constructed UDF


def udf_instance(spec: MapSpec) -> Any:
    """The callable a spec runs: its function, or its class constructed once here."""
    if not spec.is_class:
        return spec.fn
    key = id(spec)
    inst = _instances.get(key)
    if inst is None:
        inst = spec.fn(*spec.fn_constructor_args, **spec.fn_constructor_kwargs)
        _instances[key] = inst
    return inst


def rebatch(tables: Iterable[pa.Table], batch_size) -> Iterator[pa.Table]:
    """The stream of tables cut into tables of ``batch_size`` rows (the last may be short);
    ``None``: one per input table (the consumer's batching, iterator.iter_tables)."""
    from torus.data.iterator import iter_tables
    return iter_tables(iter(tables), batch_size, drop_last=False)


def _outputs(result: Any) -> Iterator[Any]:
    if inspect.isgenerator(result):
        yield from result
    else:
        yield result


def _apply_batches(spec: MapSpec, fn, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    size = DEFAULT_BATCH_SIZE if spec.batch_size == "default" else spec.batch_size
    for t in rebatch(tables, size):
        batch = B.to_batch(t, spec.batch_format)
        for out in _outputs(fn(batch, *spec.fn_args, **spec.fn_kwargs)):
            yield B.from_batch(out)


def _apply_rows(spec: MapSpec, fn, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    for t in tables:
        if spec.kind == "filter":
            keep = [bool(fn(r, *spec.fn_args, **spec.fn_kwargs)) for r in B.rows(t)]
            yield t.filter(pa.array(keep, type=pa.bool_())) if keep else t
            continue
        outs: List[Any] = []
        for r in B.rows(t):
            if spec.kind == "map_rows":
                out = fn(r, *spec.fn_args, **spec.fn_kwargs)
                if not isinstance(out, dict):
                    raise ValueError(f"Expected a dict from the function passed to map, got "
                                     f"{type(out).__name__}: {out!r:.200}")
                outs.append(out)
            else:  # flat_map
                outs.extend(fn(r, *spec.fn_args, **spec.fn_kwargs))
        if outs:
            yield B.from_rows(outs)


def apply(spec: MapSpec, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    fn = udf_instance(spec)
    if spec.kind == "map_batches":
        return _apply_batches(spec, fn, tables)
    return _apply_rows(spec, fn, tables)


def split_rows(t: pa.Table, n: int) -> List[pa.Table]:
    """``t`` in ``n`` contiguous pieces of (nearly) equal rows."""
    if n <= 1:
        return [t]
    rows = t.num_rows
    bounds = [rows * i // n for i in range(n + 1)]
    return [t.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(n)]


def _source_tables(source: Any) -> Iterable[pa.Table]:
    if isinstance(source, pa.Table):
        return [source]
    if isinstance(source, (list, tuple)):  # blocks, or one ReadTask
        if len(source) == 1 and not isinstance(source[0], pa.Table):
            return _source_tables(source[0])
        return list(source)
    if callable(source):  # a ReadTask
        return source()
    raise TypeError(f"unexpected task input {type(source).__name__}")


def run_chain(source: Any, chain: List[MapSpec], num_blocks: int, input_files=None):
    """The body of a read/map task (see the module docstring)."""
    t0 = time.perf_counter()
    tables: Iterable[pa.Table] = _source_tables(source)
    for spec in chain:
        tables = apply(spec, tables)
    out = [t for t in tables]
    whole = B.concat(out) if out else pa.table({})
    if not out and not chain:
        first = source[0] if isinstance(source, (list, tuple)) and source else source
        if isinstance(first, pa.Table):
            whole = first.schema.empty_table()
    pieces = split_rows(whole, num_blocks)
    dt = time.perf_counter() - t0
    metas = [B.BlockMetadata.of(p, input_files, dt / max(1, len(pieces))) for p in pieces]
    return (*pieces, metas)
