"""User-defined sources: Ray's ``Datasource`` base class and ``read_datasource``'s adapter.

A ``Datasource`` subclass returns read tasks from ``get_read_tasks(parallelism)``; each is a
Torus ``ReadTask`` or anything shaped like Ray's (a ``read_fn`` returning blocks, a
``metadata`` with ``num_rows``/``size_bytes``/``input_files``). Blocks a task yields may be
Arrow tables, pandas DataFrames, dicts of numpy arrays or lists of row dicts; the adapter turns
them into Arrow tables on the worker.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, Iterator, List, Optional

import pyarrow as pa

from torus.data._internal.read_task import ReadTask


class Datasource:
    """Base class of a custom source (Ray 2.60's ``ray.data.Datasource``).

    Example:
        >>> class Squares(Datasource):
        ...     def get_read_tasks(self, parallelism, **kwargs):
        ...         return [ReadTask(lambda i=i: [pa.table({"x": [i * i]})]) for i in range(4)]
        >>> torus.data.read_datasource(Squares()).take_all()
    """

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context: Any = None) -> List[Any]:
        raise NotImplementedError

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_name(self) -> str:
        name = type(self).__name__
        suffix = "Datasource"
        return name[:-len(suffix)] if name.endswith(suffix) and name != suffix else name

    @property
    def supports_distributed_reads(self) -> bool:
        return True


def _as_table(block: Any) -> pa.Table:
    from torus.data.block import from_batch, from_rows
    if isinstance(block, pa.Table):
        return block
    if isinstance(block, list):
        return from_rows(block)
    return from_batch(block)


def _run_user_task(fn: Any) -> Iterator[pa.Table]:
    out = fn()
    blocks: Iterable[Any] = [out] if isinstance(out, pa.Table) else out
    for b in blocks:
        yield _as_table(b)


def to_read_task(task: Any) -> ReadTask:
    """A task from ``get_read_tasks`` as Torus's ReadTask (Ray's shape accepted too)."""
    if isinstance(task, ReadTask) and not _is_meta(task.num_rows):
        fn, rows, size, files, schema = (task.read_fn, task.num_rows, task.size_bytes,
                                         task.input_files, task.schema)
    else:
        fn = getattr(task, "read_fn", None) or getattr(task, "_read_fn", None) or task
        meta = getattr(task, "metadata", None) or getattr(task, "num_rows", None)
        rows = getattr(meta, "num_rows", None)
        size = getattr(meta, "size_bytes", None)
        files = list(getattr(meta, "input_files", None) or [])
        schema = getattr(task, "schema", None)
        schema = schema if isinstance(schema, pa.Schema) else None
    if not callable(fn):
        raise TypeError(f"a read task must be callable or have a read_fn, got {task!r:.100}")
    return ReadTask(functools.partial(_run_user_task, fn), num_rows=rows, size_bytes=size,
                    input_files=list(files or []), schema=schema)


def _is_meta(value: Any) -> bool:
    """ReadTask(read_fn, BlockMetadata(...)) written as in Ray lands the metadata in
    num_rows."""
    return value is not None and not isinstance(value, int) and hasattr(value, "num_rows")
