"""``.npy`` source: one row per entry of an array's first axis, in column ``data``.

A 1-D array gives a plain column (int64, float64...); an n-D array a tensor column of shape
``arr.shape[1:]`` (read back by ``take_batch`` as one ndarray), as Ray does. Local files are
memory-mapped and cut into blocks of ``target_max_block_size`` (only a block's rows are
copied at a time); remote files are read whole first.
"""
from __future__ import annotations

import io
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.file_source import FileSourceArgs, open_stream, plan_file_tasks


def read_npy_file(fs: pafs.FileSystem, path: str, size: int, target_max: int, *,
                  allow_pickle: bool = False, open_args: Optional[Dict[str, Any]] = None,
                  numpy_load_args: Optional[Dict[str, Any]] = None) -> Iterator[pa.Table]:
    """One ``.npy`` file as tables of at most ``target_max`` bytes, column ``data``."""
    from torus.data.block import numpy_to_column
    load_args = dict(numpy_load_args or {})
    if isinstance(fs, pafs.LocalFileSystem) and not allow_pickle and not open_args \
            and not _compressed(path):
        load_args.setdefault("mmap_mode", "r")
        arr = np.load(path, allow_pickle=False, **load_args)
    else:
        with open_stream(fs, path, open_args) as f:
            arr = np.load(io.BytesIO(f.read()), allow_pickle=allow_pickle, **load_args)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    row_bytes = max(1, arr.nbytes // max(1, len(arr)))
    rows = max(1, target_max // row_bytes)
    for start in range(0, len(arr), rows):
        chunk = np.ascontiguousarray(arr[start:start + rows])
        yield pa.table({"data": numpy_to_column(chunk)})


def _compressed(path: str) -> bool:
    return path.lower().endswith((".gz", ".bz2", ".zst", ".lz4", ".br"))


def numpy_tasks(args: FileSourceArgs, *, allow_pickle: bool,
                arrow_open_stream_args: Optional[Dict[str, Any]],
                numpy_load_args: Dict[str, Any]) -> List[ReadTask]:
    opts = dict(allow_pickle=allow_pickle, open_args=arrow_open_stream_args,
                numpy_load_args=numpy_load_args)
    return plan_file_tasks(args, read_npy_file, opts, coalesce=True)
