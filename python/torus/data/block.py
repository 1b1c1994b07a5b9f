"""Blocks: the unit of data Ray Data moves, here a ``pyarrow.Table`` in the object store.

Conversions between a block and the batch formats users see ("numpy": a dict of column name to
numpy array, "pandas": a DataFrame, "pyarrow": the table itself) and rows (dicts). Tensor
columns (a numpy array of ndim > 1 in a batch) are Arrow fixed-shape tensor columns, read back
as one numpy array of shape (rows, *shape) without a copy where Arrow allows. Pure functions,
any thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

import numpy as np
import pyarrow as pa

Block = pa.Table
BATCH_FORMATS = ("default", "numpy", "pandas", "pyarrow")


@dataclass
class BlockMetadata:
    """What the driver knows of a block without fetching it (Ray's field order:
    num_rows, size_bytes, input_files, exec_stats; the schema travels with it here)."""
    num_rows: Optional[int]
    size_bytes: Optional[int]
    input_files: Optional[List[str]] = field(default_factory=list)
    exec_stats: Any = None
    schema: Optional[pa.Schema] = None
    exec_s: float = 0.0     # time the task that made it spent (stats)

    @staticmethod
    def of(table: pa.Table, input_files=None, exec_s: float = 0.0) -> "BlockMetadata":
        return BlockMetadata(table.num_rows, table_nbytes(table), list(input_files or []),
                             schema=table.schema, exec_s=exec_s)


def table_nbytes(t: pa.Table) -> int:
    try:
        return int(t.nbytes)
    except Exception:  # some extension types cannot say
        return int(t.get_total_buffer_size())


def empty_table(schema: Optional[pa.Schema] = None) -> pa.Table:
    return schema.empty_table() if schema is not None else pa.table({})


def concat(tables: List[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_columns or t.num_rows]
    if not tables:
        return pa.table({})
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    # Tensor columns of different shapes (images of different sizes): variable-shaped.
    names = {n for t in tables for n in t.column_names}
    mixed = [n for n in names if len({str(t.schema.field(n).type) for t in tables
                                      if n in t.column_names}) > 1
             and any(_is_tensor(t.schema.field(n).type) or _is_ragged(t.schema.field(n).type)
                     for t in tables if n in t.column_names)]
    if mixed:
        tables = [_with_ragged(t, mixed) for t in tables]
    return pa.concat_tables(tables, promote_options="permissive")


def _is_tensor(t: pa.DataType) -> bool:
    return isinstance(t, pa.FixedShapeTensorType)


# A variable-shaped tensor column: per row, its values (flattened) and its shape.
_RAGGED = ("__tensor_data", "__tensor_shape")


def _is_ragged(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and [t.field(i).name for i in range(t.num_fields)] == list(_RAGGED)


def ragged_column(arrays: List[np.ndarray]) -> pa.Array:
    """Arrays of different shapes (one per row) as a variable-shaped tensor column."""
    data = pa.array([np.ravel(a) for a in arrays])
    shape = pa.array([list(a.shape) for a in arrays], type=pa.list_(pa.int64()))
    return pa.StructArray.from_arrays([data, shape], names=list(_RAGGED))


def _ragged_to_numpy(arr) -> np.ndarray:
    out = np.empty(len(arr), dtype=object)
    data = arr.field(_RAGGED[0])
    shapes = arr.field(_RAGGED[1]).to_pylist()
    for i, shp in enumerate(shapes):
        out[i] = data[i].values.to_numpy(zero_copy_only=False).reshape(shp)
    return out


def _with_ragged(t: pa.Table, cols: List[str]) -> pa.Table:
    for n in cols:
        if n not in t.column_names or _is_ragged(t.schema.field(n).type):
            continue
        i = t.schema.get_field_index(n)
        t = t.set_column(i, n, ragged_column(list(column_to_numpy(t.column(i)))))
    return t


def column_to_numpy(col: pa.ChunkedArray) -> np.ndarray:
    """One column as numpy: tensors as (rows, *shape); strings and nested values as objects."""
    if _is_tensor(col.type):
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        return arr.to_numpy_ndarray()
    if col.num_chunks == 1:
        chunk = col.chunk(0)
    else:
        chunk = col.combine_chunks()
    if _is_ragged(chunk.type):
        return _ragged_to_numpy(chunk)
    if pa.types.is_fixed_size_list(chunk.type):
        dense = _fixed_lists_to_numpy(chunk)
        if dense is not None:
            return dense
    if pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
        out = np.empty(len(chunk), dtype=object)
        for i, v in enumerate(chunk.to_pylist()):
            out[i] = np.asarray(v) if v is not None else None
        return out
    return chunk.to_numpy(zero_copy_only=False)


def _fixed_lists_to_numpy(chunk) -> Optional[np.ndarray]:
    """Fixed-size lists (of fixed-size lists ...) of numbers without nulls as one array of
    shape (rows, size, ...), zero-copy where Arrow allows (as Ray gives tensors stored so in
    Parquet); None for anything else."""
    shape = [len(chunk)]
    arr = chunk
    while pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            return None
        shape.append(arr.type.list_size)
        arr = arr.flatten()
    if arr.null_count or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)
                              or pa.types.is_boolean(arr.type)):
        return None
    return arr.to_numpy(zero_copy_only=False).reshape(shape)


def numpy_to_column(arr: Any) -> pa.Array:
    """A batch column (numpy array, list, pandas series) as an Arrow array."""
    if isinstance(arr, (pa.Array, pa.ChunkedArray)):
        return arr
    if not isinstance(arr, np.ndarray):
        if hasattr(arr, "to_numpy"):  # pandas Series
            arr = arr.to_numpy()
        else:
            arr = list(arr)
            if arr and all(isinstance(x, np.ndarray) for x in arr):
                shapes = {x.shape for x in arr}
                if len(shapes) == 1:
                    return numpy_to_column(np.stack(arr))
                return ragged_column(arr)
            return pa.array(arr)
    if arr.ndim > 1:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(arr))
    if arr.dtype == object and len(arr) and isinstance(arr[0], np.ndarray):
        if all(isinstance(x, np.ndarray) for x in arr):
            shapes = {x.shape for x in arr}
            if len(shapes) == 1:
                return numpy_to_column(np.stack(list(arr)))
            return ragged_column(list(arr))
        return pa.array([x.tolist() if isinstance(x, np.ndarray) else x for x in arr])
    return pa.array(arr)


def to_batch(t: pa.Table, batch_format: Optional[str]):
    """The block in a user-facing batch format."""
    fmt = batch_format or "default"
    if fmt in ("default", "numpy"):
        return {name: column_to_numpy(t.column(i)) for i, name in enumerate(t.column_names)}
    if fmt == "pyarrow":
        return t
    if fmt == "pandas":
        return _to_pandas(t)
    raise ValueError(f"The given batch format {batch_format!r} isn't allowed (must be one of "
                     f"{list(BATCH_FORMATS)})")


def _to_pandas(t: pa.Table):
    import pandas as pd
    if not any(_is_tensor(f.type) for f in t.schema):
        return t.to_pandas()
    return pd.DataFrame({name: list(column_to_numpy(t.column(i))) if _is_tensor(t.column(i).type)
                         else t.column(i).to_pandas()
                         for i, name in enumerate(t.column_names)})


def from_batch(batch: Any) -> pa.Table:
    """What a map_batches function returned, as a block."""
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, Mapping):
        cols = {str(k): numpy_to_column(v) for k, v in batch.items()}
        lengths = {len(c) for c in cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"the columns of a batch have different lengths: "
                             f"{ {k: len(c) for k, c in cols.items()} }")
        return pa.table(cols)
    mod = type(batch).__module__
    if mod.startswith("pandas"):
        return _from_pandas(batch)
    raise ValueError(f"The `fn` you passed to `map_batches` returned a value of type "
                     f"{type(batch)}. This isn't allowed -- `map_batches` expects `fn` to return "
                     f"a `pandas.DataFrame`, `pyarrow.Table`, or a dict of `numpy.ndarray`s.")


def _from_pandas(df) -> pa.Table:
    cols = {}
    for name in df.columns:
        s = df[name]
        if s.dtype == object and len(s) and isinstance(s.iloc[0], np.ndarray):
            cols[str(name)] = numpy_to_column(list(s))
        else:
            cols[str(name)] = pa.Array.from_pandas(s)
    return pa.table(cols) if cols else pa.table({})


def _plain(t: pa.DataType) -> bool:
    return not (_is_tensor(t) or _is_ragged(t) or pa.types.is_fixed_size_list(t))


def rows(t: pa.Table) -> Iterator[Dict[str, Any]]:
    """The block's rows as dicts (tensor cells as numpy arrays)."""
    if all(_plain(f.type) for f in t.schema):
        yield from t.to_pylist()   # Arrow's own conversion: several times faster per row
        return
    names = t.column_names
    cols = []
    for i in range(t.num_columns):
        c = t.column(i)
        tensor = not _plain(c.type)
        cols.append(list(column_to_numpy(c)) if tensor else c.to_pylist())
    for r in range(t.num_rows):
        yield {n: col[r] for n, col in zip(names, cols)}


def from_rows(items: Iterable[Any]) -> pa.Table:
    """Rows (dicts) as a block; numpy cells of one shape become a tensor column."""
    items = list(items)
    if not items:
        return pa.table({})
    if not all(isinstance(r, Mapping) for r in items):
        bad = next(r for r in items if not isinstance(r, Mapping))
        raise ValueError(f"Expected a dict for each row (as Ray Data's rows are), got "
                         f"{type(bad).__name__}: {bad!r:.200}")
    if not any(isinstance(v, (np.ndarray, np.generic)) for v in items[0].values()):
        try:  # plain Python values: Arrow's own conversion
            return pa.Table.from_pylist(items)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    names: List[str] = []
    for r in items:
        for k in r:
            if k not in names:
                names.append(k)
    cols = {}
    for n in names:
        vals = [r.get(n) for r in items]
        if vals and all(isinstance(v, np.ndarray) for v in vals):
            cols[str(n)] = numpy_to_column(vals)
        elif any(isinstance(v, np.generic) for v in vals):
            cols[str(n)] = pa.array([v.item() if isinstance(v, np.generic) else v for v in vals])
        else:
            cols[str(n)] = pa.array(vals)
    return pa.table(cols)


def slice_table(t: pa.Table, start: int, stop: int) -> pa.Table:
    return t.slice(start, max(0, stop - start))
