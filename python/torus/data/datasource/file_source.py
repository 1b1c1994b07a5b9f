"""Planning shared by the sources: how many read tasks, which files each reads, block sizes.

Driver side (``plan_*``, ``detect_parallelism``): called once per ``read_*`` call; they list no
files and read no data themselves. Worker side (``read_files``, ``split_blocks``,
``coalesce_blocks``): module-level functions bound with ``functools.partial`` into each
``ReadTask.read_fn``, so a task pickles to the module's name plus its paths and options.

Parallelism follows Ray 2.60's heuristic: ``override_num_blocks`` when given, else
``max(min(read_op_min_num_blocks, mem / target_min_block_size), mem / target_max_block_size,
2 * CPUs)`` for an estimated in-memory size ``mem``; file sources then never plan more tasks
than files (Parquet may split a file by row groups, see parquet.py).
"""
from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    Union)

import pyarrow as pa
import pyarrow.fs as pafs

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.partitioning import (
    PathPartitionFilter, PathPartitionParser, Partitioning, add_partition_columns)
from torus.data.datasource.paths import expand_paths

_MiB = 1024 * 1024


@dataclass
class FileShuffleConfig:
    """``shuffle=FileShuffleConfig(seed)``: read files in a random order (seeded: fixed).

    The order is drawn once, when the read is planned: every execution of the dataset reads
    the files in that order (Ray reshuffles per execution unless
    ``reseed_after_execution=False``; the flag is accepted)."""

    seed: Optional[int] = None
    reseed_after_execution: bool = True


class BlockSizes:
    """The block-size knobs a task needs, captured on the driver (workers' contexts differ)."""

    def __init__(self) -> None:
        ctx = data_context()
        self.target_max = int(getattr(ctx, "target_max_block_size", None) or 128 * _MiB)
        self.target_min = int(getattr(ctx, "target_min_block_size", None) or _MiB)
        self.min_num_blocks = int(getattr(ctx, "read_op_min_num_blocks", None) or 200)


def data_context() -> Any:
    from torus.data.context import DataContext
    return DataContext.get_current()


def available_cpus() -> int:
    """CPUs of the cluster when Torus is initialized (never starts it), else of this host."""
    try:
        import torus
        if torus.is_initialized():
            cpus = int(torus.cluster_resources().get("CPU", 0))
            if cpus > 0:
                return cpus
    except Exception:  # a cluster that cannot answer: plan for this host
        pass
    return os.cpu_count() or 1


def num_blocks_arg(parallelism: int, override_num_blocks: Optional[int]) -> Optional[int]:
    """Ray's deprecated ``parallelism`` and ``override_num_blocks``: the requested count."""
    if override_num_blocks is not None:
        if override_num_blocks <= 0:
            raise ValueError(f"override_num_blocks must be > 0, got: {override_num_blocks}")
        return int(override_num_blocks)
    if parallelism is not None and parallelism != -1:
        if parallelism <= 0:
            raise ValueError(f"parallelism must be -1 or > 0, got: {parallelism}")
        return int(parallelism)
    return None


def detect_parallelism(mem_size: Optional[int], requested: Optional[int] = None) -> int:
    """The number of blocks Ray would aim for (see the module docstring)."""
    if requested is not None:
        return requested
    sizes = BlockSizes()
    lo, hi = 1, sizes.min_num_blocks
    if mem_size is not None:
        lo = max(1, int(mem_size / sizes.target_max))
        hi = min(hi, max(1, int(mem_size / sizes.target_min)))
    return max(hi, lo, 2 * available_cpus())


def split_even(items: Sequence[Any], n: int) -> List[List[Any]]:
    """``items`` in ``n`` contiguous groups whose lengths differ by at most one (no empties)."""
    n = max(1, min(n, len(items)))
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        stop = start + q + (1 if i < r else 0)
        out.append(list(items[start:stop]))
        start = stop
    return [g for g in out if g]


def shuffle_files(paths: List[str], sizes: List[int],
                  shuffle: Union[None, str, FileShuffleConfig]) -> tuple:
    if shuffle is None:
        return paths, sizes
    if shuffle == "files":
        seed = None
    elif isinstance(shuffle, FileShuffleConfig):
        seed = shuffle.seed
    else:
        raise ValueError(f"Invalid value for 'shuffle': {shuffle!r}. Valid values are None, "
                         f"'files', or a FileShuffleConfig.")
    order = list(range(len(paths)))
    random.Random(seed).shuffle(order)
    return [paths[i] for i in order], [sizes[i] for i in order]


# ---------------------------------------------------------------- worker side


def split_blocks(table: pa.Table, target_max: int) -> Iterator[pa.Table]:
    """``table`` in row slices of about ``target_max`` bytes each (zero-copy slices)."""
    from torus.data.block import table_nbytes
    nbytes = table_nbytes(table)
    if nbytes <= target_max or table.num_rows <= 1:
        yield table
        return
    pieces = -(-nbytes // target_max)
    rows = -(-table.num_rows // pieces)
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def coalesce_blocks(tables: Iterable[pa.Table], target_max: int) -> Iterator[pa.Table]:
    """Concatenates consecutive small tables of one schema up to ``target_max`` bytes (many
    small files -> few blocks), and splits big ones; order kept."""
    from torus.data.block import table_nbytes
    pending: List[pa.Table] = []
    size = 0
    for t in tables:
        if pending and (t.schema != pending[0].schema or size + table_nbytes(t) > target_max):
            yield _concat(pending)
            pending, size = [], 0
        if table_nbytes(t) >= target_max:
            yield from split_blocks(t, target_max)
            continue
        pending.append(t)
        size += table_nbytes(t)
    if pending:
        yield _concat(pending)


def _concat(tables: List[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


# reader(fs, path, size, target_max, **options) -> the file's tables
FileReader = Callable[..., Iterator[pa.Table]]


def read_files(fs: pafs.FileSystem, files: List[Tuple[str, int]], reader: FileReader,
               options: Dict[str, Any], partitioning: Optional[Partitioning],
               include_paths: bool, target_max: int, coalesce: bool) -> Iterator[pa.Table]:
    """A read task's body: ``reader`` on each (path, size) in order, with the partition
    columns and ``path`` column added, cut (and with ``coalesce``, merged) to ``target_max``
    bytes."""
    def tables() -> Iterator[pa.Table]:
        parse = PathPartitionParser(partitioning) if partitioning is not None else None
        for path, size in files:
            parts = parse(path) if parse is not None else {}
            for t in reader(fs, path, size, target_max, **options):
                yield add_path_columns(t, path, parts, include_paths)
    if coalesce:
        yield from coalesce_blocks(tables(), target_max)
    else:
        for t in tables():
            yield from split_blocks(t, target_max)


def add_path_columns(t: pa.Table, path: str, parts: Dict[str, Any],
                     include_paths: bool) -> pa.Table:
    """Appends the partition columns (``parts``) and, if asked, the ``path`` column."""
    if parts:
        t = add_partition_columns(t, parts)
    if include_paths:
        t = t.append_column("path", pa.repeat(path, t.num_rows).cast(pa.string()))
    return t


# ---------------------------------------------------------------- driver side


@dataclass
class FileSourceArgs:
    """What every file-based ``read_*`` takes besides its format's own options."""

    paths: Union[str, List[str]]
    filesystem: Optional[pafs.FileSystem] = None
    partition_filter: Optional[PathPartitionFilter] = None
    partitioning: Optional[Partitioning] = None
    include_paths: bool = False
    ignore_missing_paths: bool = False
    shuffle: Union[None, str, FileShuffleConfig] = None
    file_extensions: Optional[List[str]] = None
    num_blocks: Optional[int] = None


def list_files(args: FileSourceArgs) -> tuple:
    """(filesystem, paths, sizes) after listing, partition filter and extensions; shuffled
    when asked. Raises FileNotFoundError / ValueError as Ray does."""
    fs, paths, sizes = expand_paths(args.paths, args.filesystem,
                                    ignore_missing_paths=args.ignore_missing_paths)
    if args.partition_filter is not None:
        keep = set(args.partition_filter(paths))
        sizes = [s for p, s in zip(paths, sizes) if p in keep]
        paths = [p for p in paths if p in keep]
        if not paths:
            raise ValueError("No input files found to read. Please double check that "
                             "'partition_filter' field is set properly.")
    if args.file_extensions is not None:
        from torus.data.datasource.paths import has_file_extension
        kept = [(p, s) for p, s in zip(paths, sizes)
                if has_file_extension(p, args.file_extensions)]
        if not kept:
            raise ValueError(
                f"No input files found to read with the following file extensions: "
                f"{args.file_extensions}. Please double check that 'file_extensions' "
                f"field is set properly.")
        paths, sizes = [p for p, _ in kept], [s for _, s in kept]
    paths, sizes = shuffle_files(paths, sizes, args.shuffle)
    return fs, paths, sizes


def plan_file_tasks(args: FileSourceArgs, reader: FileReader, options: Dict[str, Any], *,
                    size_ratio: float = 1.0, rows_per_file: Optional[int] = None,
                    coalesce: bool = False, task_fn: Callable[..., Iterator[pa.Table]]
                    = read_files) -> List[ReadTask]:
    """ReadTasks over the files of ``args``: contiguous groups of files, at most one task per
    file, ``reader`` called per file on the worker (by ``task_fn``, read_files' signature).
    ``size_ratio`` estimates in-memory bytes per file byte; ``rows_per_file`` (when known,
    e.g. binary files: 1) fills num_rows."""
    fs, paths, sizes = list_files(args)
    mem = int(sum(sizes) * size_ratio)
    n = detect_parallelism(mem, args.num_blocks)
    target = BlockSizes().target_max
    tasks = []
    for group in split_even(list(zip(paths, sizes)), n):
        group_paths = [p for p, _ in group]
        fn = functools.partial(task_fn, fs, group, reader, dict(options),
                               args.partitioning, args.include_paths, target, coalesce)
        tasks.append(ReadTask(
            fn,
            num_rows=rows_per_file * len(group) if rows_per_file is not None else None,
            size_bytes=int(sum(s for _, s in group) * size_ratio),
            input_files=group_paths))
    return tasks


def open_stream(fs: pafs.FileSystem, path: str, open_args: Optional[Dict[str, Any]]):
    """An input stream on ``path``: decompressed by its extension (``.gz``, ``.zst``...) unless
    ``open_args`` says ``compression``; Ray's ``arrow_open_stream_args``."""
    kwargs = dict(open_args or {})
    kwargs.setdefault("compression", "detect")
    return fs.open_input_stream(path, **kwargs)
