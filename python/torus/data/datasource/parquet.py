"""Parquet source: ``read_parquet``'s planning (driver) and reading (worker).

Planning lists the files, reads Parquet footers (all of them when there are few files, a sample
otherwise) for the schema, row counts and uncompressed sizes, and cuts the work into read tasks:
contiguous groups of files, or, when there are fewer files than the parallelism asks for, files
split by row groups. A task pickles only paths, row-group ids and options.

Reading uses ``pyarrow.dataset`` Parquet fragments: column projection and the ``filter``
expression (pyarrow.dataset expression; row-group statistics prune first) run inside Arrow's
C++ reader, multithreaded, with no per-row Python and no pandas. Hive partition values are
materialized from each fragment's partition expression, so a filter may name them too. A
task reads its row groups in chunks of at most ``target_max_block_size`` uncompressed bytes,
one block per chunk.
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.file_source import (
    BlockSizes, FileSourceArgs, available_cpus, detect_parallelism, list_files, split_blocks,
    split_even)
from torus.data.datasource.partitioning import Partitioning, PathPartitionParser

# Footers read at planning: all files up to this many, else an evenly spaced sample.
_MAX_FOOTERS = 256
_SAMPLE_FOOTERS = 16
_FOOTER_THREADS = 16
# Keyword arguments of Fragment.to_table a user may pass through **arrow_parquet_args.
_SCAN_KWARGS = ("batch_size", "batch_readahead", "fragment_readahead",
                "fragment_scan_options", "use_threads", "cache_metadata", "memory_pool")
# Accepted for Ray compatibility and not needed here.
_IGNORED_KWARGS = ("dataset_kwargs", "to_batch_kwargs", "meta_provider")
_SCAN_BATCH_ROWS = 1 << 22
_PY_TO_ARROW = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}


@dataclass
class _Piece:
    """One unit of reading: a file, or some of its row groups (None: all)."""

    path: str
    row_groups: Optional[List[int]]
    num_rows: Optional[int]
    size_bytes: int


@dataclass
class _ScanOptions:
    """What every task of one read_parquet call shares (pickled into each task)."""

    columns: Optional[List[str]]
    filter: Optional[pds.Expression]
    schema: Optional[pa.Schema]
    partitioning: Optional[Partitioning]
    include_paths: bool
    tensor_column_schema: Optional[Dict[str, Tuple[Any, Tuple[int, ...]]]]
    scan_kwargs: Dict[str, Any]
    target_max: int


def split_parquet_args(kwargs: Dict[str, Any]) -> Tuple[Optional[pds.Expression],
                                                         Optional[pa.Schema], Dict[str, Any]]:
    """``**arrow_parquet_args`` -> (filter, schema, scan kwargs); unknown names raise."""
    kwargs = dict(kwargs)
    flt = kwargs.pop("filter", None)
    schema = kwargs.pop("schema", None)
    for k in _IGNORED_KWARGS:
        kwargs.pop(k, None)
    bad = [k for k in kwargs if k not in _SCAN_KWARGS]
    if bad:
        raise TypeError(f"read_parquet() got unexpected keyword argument(s) {bad}")
    if flt is not None and not isinstance(flt, pds.Expression):
        raise TypeError(f"read_parquet(filter=...) takes a pyarrow.dataset.Expression "
                        f"(e.g. pyarrow.dataset.field('x') > 0), got {type(flt).__name__}")
    return flt, schema, kwargs


class ParquetSource:
    """The listed files of one ``read_parquet`` call and what their footers said.

    ``read_tasks(columns, filter)`` may be called more than once (e.g. by an optimizer pushing
    a projection or predicate down after the read): listing and footers are not repeated.
    """

    def __init__(self, args: FileSourceArgs, *, schema: Optional[pa.Schema] = None,
                 tensor_column_schema=None, scan_kwargs: Optional[Dict[str, Any]] = None):
        self.args = args
        self.fs, self.paths, self.sizes = list_files(args)
        self.user_schema = schema
        self.tensor_column_schema = tensor_column_schema
        self.scan_kwargs = dict(scan_kwargs or {})
        # Arrow's default (131072 rows) cuts a row group into several chunks; one chunk per
        # row group means fewer batches to ship and longer zero-copy numpy views downstream.
        self.scan_kwargs.setdefault("batch_size", _SCAN_BATCH_ROWS)
        self._footers = _read_footers(self.fs, self.paths)

    # ---------------------------------------------------------------- schema

    def file_schema(self) -> Optional[pa.Schema]:
        if self.user_schema is not None:
            return self.user_schema
        first = next((m for m in self._footers.values()), None)
        return first.schema.to_arrow_schema() if first is not None else None

    def output_schema(self, columns: Optional[List[str]]) -> Optional[pa.Schema]:
        """The blocks' schema, when it is known without reading data."""
        base = self.file_schema()
        if base is None or self.tensor_column_schema:
            return None
        fields = list(base)
        names = set(base.names)
        for name, typ in _partition_fields(self.args.partitioning, self.paths[0]):
            if name not in names:
                fields.append(pa.field(name, typ))
        schema = pa.schema(fields, metadata=base.metadata)
        if columns is not None:
            try:
                schema = pa.schema([schema.field(c) for c in columns], metadata=base.metadata)
            except KeyError:
                return None
        if self.args.include_paths:
            schema = schema.append(pa.field("path", pa.string()))
        return schema

    # ---------------------------------------------------------------- sizes

    def _column_share(self, columns: Optional[List[str]]) -> Optional[float]:
        """Share of the uncompressed bytes in ``columns`` (sampled footers; None: all)."""
        if columns is None or not self._footers:
            return None
        wanted = set(columns)
        tot = sel = 0
        for md in self._footers.values():
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                for j in range(rg.num_columns):
                    c = rg.column(j)
                    tot += c.total_uncompressed_size
                    if c.path_in_schema.split(".")[0] in wanted:
                        sel += c.total_uncompressed_size
        return sel / tot if tot else None

    def _ratio(self) -> float:
        """In-memory bytes per file byte, from the footers read."""
        fsize = dict(zip(self.paths, self.sizes))
        disk = sum(fsize[p] for p in self._footers)
        mem = sum(_uncompressed(md) for md in self._footers.values())
        return mem / disk if disk and mem else 5.0

    def _pieces(self, columns: Optional[List[str]], n: int) -> List[_Piece]:
        share = self._column_share(columns)
        ratio = self._ratio() * (share if share is not None else 1.0)
        pieces = []
        all_known = len(self._footers) == len(self.paths)
        for path, size in zip(self.paths, self.sizes):
            md = self._footers.get(path)
            est = int(_uncompressed(md) * (share or 1.0)) if md is not None else int(size * ratio)
            pieces.append(_Piece(path, None, md.num_rows if md is not None else None, est))
        # Split files only to give every CPU work (or to honour override_num_blocks): a
        # whole file read in one call decodes its row groups in parallel, faster than pieces.
        goal = self.args.num_blocks or min(n, 2 * available_cpus())
        if all_known and goal > len(pieces):
            pieces = self._split_by_row_groups(pieces, goal, share)
        return pieces

    def _split_by_row_groups(self, pieces: List[_Piece], n: int,
                             share: Optional[float]) -> List[_Piece]:
        total = sum(p.size_bytes for p in pieces) or 1
        min_piece = BlockSizes().target_min  # no piece smaller than a small block
        out = []
        for p in pieces:
            md = self._footers[p.path]
            k = min(md.num_row_groups, max(1, round(n * p.size_bytes / total)),
                    max(1, p.size_bytes // min_piece))
            if k <= 1:
                out.append(p)
                continue
            for rgs in split_even(list(range(md.num_row_groups)), k):
                rows = sum(md.row_group(i).num_rows for i in rgs)
                est = int(sum(md.row_group(i).total_byte_size for i in rgs) * (share or 1.0))
                out.append(_Piece(p.path, rgs, rows, est))
        return out

    # ---------------------------------------------------------------- tasks

    def read_tasks(self, columns: Optional[List[str]] = None,
                   filter: Optional[pds.Expression] = None) -> List[ReadTask]:
        """The ReadTasks reading ``columns`` (None: all) of the rows passing ``filter``."""
        share = self._column_share(columns)
        mem = int(sum(self.sizes) * self._ratio() * (share if share is not None else 1.0))
        n = detect_parallelism(mem, self.args.num_blocks)
        pieces = self._pieces(columns, n)
        opts = _ScanOptions(columns, filter, self.user_schema, self.args.partitioning,
                            self.args.include_paths, self.tensor_column_schema,
                            self.scan_kwargs, BlockSizes().target_max)
        schema = self.output_schema(columns)
        tasks = []
        for group in split_even(pieces, n):
            rows = [p.num_rows for p in group]
            tasks.append(ReadTask(
                functools.partial(read_pieces, self.fs, [(p.path, p.row_groups) for p in group],
                                  opts),
                num_rows=sum(rows) if filter is None and None not in rows else None,
                size_bytes=sum(p.size_bytes for p in group),
                input_files=list(dict.fromkeys(p.path for p in group)),
                schema=schema))
        return tasks


def _uncompressed(md: Optional[pq.FileMetaData]) -> int:
    if md is None:
        return 0
    return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))


def _read_footers(fs: pafs.FileSystem, paths: List[str]) -> Dict[str, pq.FileMetaData]:
    if len(paths) <= _MAX_FOOTERS:
        chosen = list(paths)
    else:
        idx = np.linspace(0, len(paths) - 1, _SAMPLE_FOOTERS).round().astype(int)
        chosen = [paths[i] for i in sorted(set(idx.tolist()))]

    def footer(path: str) -> pq.FileMetaData:
        try:
            return pq.read_metadata(path, filesystem=fs)
        except Exception as e:
            raise type(e)(f"{e} (reading the Parquet footer of {path})") from e

    if isinstance(fs, pafs.LocalFileSystem) or len(chosen) == 1:
        mds = [footer(p) for p in chosen]
    else:
        with ThreadPoolExecutor(min(_FOOTER_THREADS, len(chosen))) as pool:
            mds = list(pool.map(footer, chosen))
    return dict(zip(chosen, mds))


def _partition_fields(partitioning: Optional[Partitioning],
                      path: str) -> List[Tuple[str, pa.DataType]]:
    if partitioning is None:
        return []
    values = PathPartitionParser(partitioning)(path)
    types = partitioning.field_types or {}
    return [(k, _PY_TO_ARROW.get(types.get(k, str), pa.string())) for k in values]


# ---------------------------------------------------------------- worker side


def read_pieces(fs: pafs.FileSystem, pieces: Sequence[Tuple[str, Optional[List[int]]]],
                opts: _ScanOptions) -> Iterator[pa.Table]:
    """A read task's body: each piece's row groups, in chunks of <= target bytes."""
    fmt = pds.ParquetFileFormat()
    parse = PathPartitionParser(opts.partitioning) if opts.partitioning is not None else None
    for path, row_groups in pieces:
        frag, schema = _fragment(fmt, fs, path, parse, opts)
        md = frag.metadata
        rgs = row_groups if row_groups is not None else list(range(md.num_row_groups))
        for chunk in _chunks(md, rgs, opts.target_max, opts.columns):
            sub = frag.subset(row_group_ids=chunk) if len(chunk) < md.num_row_groups else frag
            table = sub.to_table(schema=schema, columns=opts.columns, filter=opts.filter,
                                 **opts.scan_kwargs)
            if table.num_rows == 0:
                continue
            if opts.tensor_column_schema:
                table = _decode_tensors(table, opts.tensor_column_schema)
            if opts.include_paths:
                table = table.append_column("path", pa.repeat(path, table.num_rows)
                                            .cast(pa.string()))
            yield from split_blocks(table, opts.target_max)


def _fragment(fmt: pds.ParquetFileFormat, fs: pafs.FileSystem, path: str,
              parse: Optional[PathPartitionParser], opts: _ScanOptions):
    """The file's fragment and the scan schema: the file's (or the user's) plus its
    partition fields, whose values come from the fragment's partition expression."""
    values = parse(path) if parse is not None else {}
    if not values:
        frag = fmt.make_fragment(path, fs)
        return frag, opts.schema
    frag0 = fmt.make_fragment(path, fs)
    base = opts.schema if opts.schema is not None else frag0.physical_schema
    types = dict(_partition_fields(opts.partitioning, path))
    expr = None
    fields = list(base)
    for name, value in values.items():
        if name in base.names:
            continue
        typ = types[name]
        fields.append(pa.field(name, typ))
        term = pds.field(name) == pa.scalar(value, type=typ)
        expr = term if expr is None else expr & term
    if expr is None:
        return frag0, opts.schema
    frag = fmt.make_fragment(path, fs, partition_expression=expr)
    return frag, pa.schema(fields, metadata=base.metadata)


def _rg_bytes(md: pq.FileMetaData, i: int, columns: Optional[List[str]]) -> int:
    rg = md.row_group(i)
    if columns is None:
        return rg.total_byte_size
    wanted = set(columns)
    return sum(rg.column(j).total_uncompressed_size for j in range(rg.num_columns)
               if rg.column(j).path_in_schema.split(".")[0] in wanted)


def _chunks(md: pq.FileMetaData, rgs: List[int], target: int,
            columns: Optional[List[str]]) -> Iterator[List[int]]:
    """Consecutive row groups, at most ``target`` uncompressed bytes of ``columns`` each."""
    chunk: List[int] = []
    size = 0
    for i in rgs:
        b = _rg_bytes(md, i, columns)
        if chunk and size + b > target:
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += b
    if chunk:
        yield chunk


def _decode_tensors(table: pa.Table, spec: Dict[str, Tuple[Any, Tuple[int, ...]]]) -> pa.Table:
    """Ray's ``tensor_column_schema``: binary cells holding raw ndarray bytes -> a tensor
    column of ``(dtype, shape)``."""
    from torus.data.block import numpy_to_column
    for name, (dtype, shape) in spec.items():
        if name not in table.column_names:
            continue
        col = table.column(name).combine_chunks()
        if col.null_count:
            raise ValueError(f"tensor column {name!r} has null cells")
        data = b"".join(v.as_buffer().to_pybytes() for v in col)
        arr = np.frombuffer(data, dtype=np.dtype(dtype)).reshape((len(col),) + tuple(shape))
        table = table.set_column(table.schema.get_field_index(name), name,
                                 numpy_to_column(arr))
    return table
