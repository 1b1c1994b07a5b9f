"""Text and binary-file sources (per-file readers for workers, and their planning).

``read_text``: one row per line in column ``text`` (lines split as ``str.splitlines`` does;
blank lines dropped unless ``drop_empty_lines=False``). ``read_binary_files``: one row per
file, its contents in column ``bytes``. Small files are merged into blocks of up to
``target_max_block_size`` within a task.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.fs as pafs

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.file_source import FileSourceArgs, open_stream, plan_file_tasks


def read_text_file(fs: pafs.FileSystem, path: str, size: int, target_max: int, *,
                   encoding: str = "utf-8", drop_empty_lines: bool = True,
                   open_args: Optional[Dict[str, Any]] = None) -> Iterator[pa.Table]:
    """One text file's lines as a table with column ``text``."""
    with open_stream(fs, path, open_args) as f:
        data = f.read()
    lines = data.decode(encoding).splitlines()
    if drop_empty_lines:
        lines = [ln for ln in lines if ln.strip()]
    yield pa.table({"text": pa.array(lines, type=pa.string())})


def read_binary_file(fs: pafs.FileSystem, path: str, size: int, target_max: int, *,
                     open_args: Optional[Dict[str, Any]] = None) -> Iterator[pa.Table]:
    """One file as a one-row table with column ``bytes``."""
    with open_stream(fs, path, open_args) as f:
        buf = f.read_buffer()
    # The buffer becomes the column's data as is (no copy); > 2 GiB needs 64-bit offsets.
    typ, off = (pa.binary(), pa.int32()) if buf.size < 2**31 else (pa.large_binary(), pa.int64())
    offsets = pa.array([0, buf.size], off).buffers()[1]
    arr = pa.Array.from_buffers(typ, 1, [None, offsets, buf])
    yield pa.table({"bytes": arr})


def text_tasks(args: FileSourceArgs, *, encoding: str, drop_empty_lines: bool,
               arrow_open_stream_args: Optional[Dict[str, Any]]) -> List[ReadTask]:
    opts = dict(encoding=encoding, drop_empty_lines=drop_empty_lines,
                open_args=arrow_open_stream_args)
    return plan_file_tasks(args, read_text_file, opts, size_ratio=2.0, coalesce=True)


def binary_tasks(args: FileSourceArgs,
                 arrow_open_stream_args: Optional[Dict[str, Any]]) -> List[ReadTask]:
    return plan_file_tasks(args, read_binary_file, dict(open_args=arrow_open_stream_args),
                           rows_per_file=1, coalesce=True)
