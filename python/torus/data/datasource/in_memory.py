"""Sources whose data starts in the driver or is generated: ``range``/``range_tensor`` read
tasks (they close over numbers only) and the tables of ``from_items`` / ``from_numpy`` /
``from_pandas`` / ``from_arrow`` (which Ray materializes into the object store at once).

Block counts follow Ray 2.60: ``range(n)`` plans ``n // parallelism`` rows per task (so
``range(10, override_num_blocks=3)`` has 4 tasks, as in Ray); ``from_items`` cuts the items in
``min(len(items), parallelism)`` even slices; the other ``from_*`` keep one block per input
unless ``override_num_blocks`` asks for another count.
"""
from __future__ import annotations

import builtins
import functools
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.file_source import BlockSizes, detect_parallelism, split_blocks


def _range_blocks(start: int, count: int, shape: Optional[Tuple[int, ...]],
                  rows_per_block: int) -> Iterator[pa.Table]:
    """A range task's body: rows ``start .. start+count`` in blocks of ``rows_per_block``."""
    from torus.data.block import numpy_to_column
    stop = start + count
    while start < stop:
        n = min(rows_per_block, stop - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        if shape is None:
            yield pa.table({"id": pa.array(ids)})
        else:
            data = np.empty((n,) + shape, dtype=np.int64)
            data[...] = ids.reshape((n,) + (1,) * len(shape))
            yield pa.table({"data": numpy_to_column(data)})
        start += n


def range_tasks(n: int, shape: Optional[Tuple[int, ...]],
                requested: Optional[int]) -> Tuple[List[ReadTask], pa.Schema]:
    """The read tasks of ``range(n)`` (``shape`` None) or ``range_tensor(n, shape=shape)``."""
    from torus.data.block import numpy_to_column
    n = int(n)
    elems = int(np.prod(shape)) if shape is not None else 1
    row_bytes = 8 * elems
    if shape is None:
        schema = pa.schema([("id", pa.int64())])
    else:
        schema = pa.table({"data": numpy_to_column(np.zeros((1,) + shape, np.int64))}).schema
    if n <= 0:
        return [], schema
    parallelism = detect_parallelism(row_bytes * n, requested)
    per_task = max(1, n // parallelism)
    rows_per_block = max(1, BlockSizes().target_max // row_bytes)
    tasks = []
    for start in builtins.range(0, n, per_task):
        count = min(per_task, n - start)
        tasks.append(ReadTask(
            functools.partial(_range_blocks, start, count, shape, rows_per_block),
            num_rows=count, size_bytes=row_bytes * count, schema=schema))
    return tasks, schema


def items_tables(items: Sequence[Any], requested: Optional[int]) -> List[pa.Table]:
    """``from_items``: dict items become rows (keys -> columns), anything else ``{"item": x}``."""
    from torus.data.block import from_rows
    if not isinstance(items, (list, tuple)):
        if isinstance(items, Mapping) or not hasattr(items, "__iter__"):
            raise TypeError(f"Argument `items` must be a list, got {type(items).__name__}")
        items = list(items)
    n = detect_parallelism(None, requested)
    n = min(len(items), n)
    if n == 0:
        return []
    q, r = divmod(len(items), n)
    out = []
    start = 0
    for i in builtins.range(n):
        stop = start + q + (1 if i < r else 0)
        rows = [x if isinstance(x, Mapping) else {"item": x} for x in items[start:stop]]
        out.append(from_rows(rows))
        start = stop
    return out


def numpy_tables(ndarrays: Any) -> List[pa.Table]:
    """``from_numpy``: one block per array, column ``data`` (n-D arrays: a tensor column)."""
    from torus.data.block import numpy_to_column
    if isinstance(ndarrays, np.ndarray):
        ndarrays = [ndarrays]
    out = []
    for arr in ndarrays:
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"Expected a numpy.ndarray or a list of them, got "
                             f"{type(arr).__name__}")
        if arr.ndim == 0:
            arr = arr.reshape(1)
        out.append(pa.table({"data": numpy_to_column(arr)}))
    return out


def pandas_tables(dfs: Any, requested: Optional[int]) -> List[pa.Table]:
    """``from_pandas``: one block per DataFrame (or ``requested`` blocks)."""
    import pandas as pd
    from torus.data.block import from_batch
    if isinstance(dfs, pd.DataFrame):
        dfs = [dfs]
    for df in dfs:
        if not isinstance(df, pd.DataFrame):
            raise ValueError(f"Expected a pandas.DataFrame or a list of them, got "
                             f"{type(df).__name__}")
    return resplit([from_batch(df) for df in dfs], requested)


def arrow_tables(tables: Any, requested: Optional[int]) -> List[pa.Table]:
    """``from_arrow``: tables (or Arrow IPC stream bytes), one block each (or ``requested``)."""
    if isinstance(tables, (pa.Table, bytes, pa.RecordBatch)):
        tables = [tables]
    out = []
    for t in tables:
        if isinstance(t, bytes):
            t = pa.ipc.open_stream(t).read_all()
        elif isinstance(t, pa.RecordBatch):
            t = pa.Table.from_batches([t])
        elif not isinstance(t, pa.Table):
            raise ValueError(f"Expected a pyarrow.Table or a list of them, got "
                             f"{type(t).__name__}")
        out.append(t)
    return resplit(out, requested)


def resplit(tables: List[pa.Table], requested: Optional[int]) -> List[pa.Table]:
    """``tables`` as ``requested`` blocks of even row counts (zero-copy slices); as they are
    (cut to the target block size) when ``requested`` is None."""
    if requested is None:
        target = BlockSizes().target_max
        return [b for t in tables for b in split_blocks(t, target)]
    if not tables:
        return []
    whole = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 \
        else tables[0]
    n = max(1, min(requested, whole.num_rows))
    q, r = divmod(whole.num_rows, n)
    out, start = [], 0
    for i in builtins.range(n):
        size = q + (1 if i < r else 0)
        out.append(whole.slice(start, size))
        start += size
    return out
