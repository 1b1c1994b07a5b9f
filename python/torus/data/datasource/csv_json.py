"""CSV and JSON sources: per-file readers (worker side) and their ``read_*`` planning.

CSV: ``pyarrow.csv`` with the user's ``read_options`` / ``parse_options`` /
``convert_options``; a file that fits in a block is read at once (multithreaded parse), a
bigger one is streamed batch by batch (the first batch's schema fixed for the rest, as Ray
does). JSON: ``pyarrow.json`` reads JSON lines; a file it refuses (a JSON array or a single
object) is parsed with the ``json`` module, as Ray falls back. Compressed files (``.gz``,
``.zst``, ``.bz2``, ``.lz4``, ``.br``) are decompressed by their extension.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.file_source import FileSourceArgs, open_stream, plan_file_tasks

_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4", ".br", ".zstd", ".snappy")
# Streamed CSV batches: large enough that a batch is a good block, small enough to stream.
_CSV_STREAM_BLOCK = 16 * 1024 * 1024
_JSON_BLOCK = 16 * 1024 * 1024


def _compressed(path: str) -> bool:
    return path.lower().endswith(_COMPRESSED)


def read_csv_file(fs: pafs.FileSystem, path: str, size: int, target_max: int, *,
                  open_args: Optional[Dict[str, Any]] = None,
                  read_options: Optional[pacsv.ReadOptions] = None,
                  parse_options: Optional[pacsv.ParseOptions] = None,
                  convert_options: Optional[pacsv.ConvertOptions] = None,
                  ) -> Iterator[pa.Table]:
    """One CSV file's rows as tables (the file whole when small, else streamed)."""
    kwargs = dict(parse_options=parse_options, convert_options=convert_options)
    try:
        with open_stream(fs, path, open_args) as f:
            if size * (8 if _compressed(path) else 1) <= target_max:
                yield pacsv.read_csv(f, read_options=read_options, **kwargs)
                return
            if read_options is None:
                read_options = pacsv.ReadOptions(block_size=_CSV_STREAM_BLOCK)
            reader = pacsv.open_csv(f, read_options=read_options, **kwargs)
            for batch in reader:
                if batch.num_rows:
                    yield pa.Table.from_batches([batch])
    except pa.ArrowInvalid as e:
        raise ValueError(
            f"Failed to read CSV file: {path}. Please check the CSV file has correct format, "
            f"or filter out non-CSV file with 'partition_filter' field. See read_csv() "
            f"documentation for more details. ({e})") from e


def read_json_file(fs: pafs.FileSystem, path: str, size: int, target_max: int, *,
                   open_args: Optional[Dict[str, Any]] = None,
                   read_options: Optional[pajson.ReadOptions] = None,
                   parse_options: Optional[pajson.ParseOptions] = None) -> Iterator[pa.Table]:
    """One JSON file's records as a table: JSON lines, or a JSON array / single object."""
    with open_stream(fs, path, open_args) as f:
        buf = f.read_buffer()
    if buf.size == 0:
        return
    block = read_options.block_size if read_options is not None else _JSON_BLOCK
    while True:
        opts = pajson.ReadOptions(use_threads=True, block_size=block)
        try:
            yield pajson.read_json(pa.BufferReader(buf), read_options=opts,
                                   parse_options=parse_options)
            return
        except pa.ArrowInvalid as e:
            # A record longer than the block: retry with a bigger block, up to the file.
            if "straddling" in str(e) and block < buf.size:
                block = min(block * 4, buf.size + 1)
                continue
            table = _python_json(buf, path, e)
            if table is not None:
                yield table
            return


def _python_json(buf: pa.Buffer, path: str, arrow_error: Exception) -> Optional[pa.Table]:
    try:
        value = json.loads(buf.to_pybytes())
    except ValueError:
        raise ValueError(f"Failed to read JSON file: {path}: {arrow_error}") from arrow_error
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"Failed to read JSON file: {path}: the top-level value is a "
                         f"{type(value).__name__}, not an object, array of objects or lines")
    if not value:
        return None
    if not all(isinstance(v, dict) for v in value):
        raise ValueError(f"Failed to read JSON file: {path}: a JSON array's items must be "
                         f"objects (one per row)")
    return pa.Table.from_pylist(value)


def csv_tasks(args: FileSourceArgs, arrow_open_stream_args: Optional[Dict[str, Any]],
              arrow_csv_args: Dict[str, Any]) -> List[ReadTask]:
    """read_csv's tasks; ``arrow_csv_args`` are read_options/parse_options/convert_options."""
    opts = dict(arrow_csv_args)
    bad = [k for k in opts if k not in ("read_options", "parse_options", "convert_options")]
    if bad:
        raise TypeError(f"read_csv() got unexpected keyword argument(s) {bad}")
    opts["open_args"] = arrow_open_stream_args
    return plan_file_tasks(args, read_csv_file, opts, coalesce=True)


def json_tasks(args: FileSourceArgs, arrow_open_stream_args: Optional[Dict[str, Any]],
               arrow_json_args: Dict[str, Any]) -> List[ReadTask]:
    """read_json's tasks; ``arrow_json_args`` are read_options/parse_options."""
    opts = dict(arrow_json_args)
    bad = [k for k in opts if k not in ("read_options", "parse_options")]
    if bad:
        raise TypeError(f"read_json() got unexpected keyword argument(s) {bad}")
    opts["open_args"] = arrow_open_stream_args
    return plan_file_tasks(args, read_json_file, opts, coalesce=True)
