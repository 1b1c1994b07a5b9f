"""Ray Data's sources (Ray 2.60 names, signatures and semantics): ``range``, ``from_*`` and
``read_*``.

The ``read_*`` functions list their files on the driver when called (a missing path raises
``FileNotFoundError`` naming it then, as Ray) and return a lazy Dataset of read tasks that run
when it is consumed; ``from_*`` put their blocks in the object store at once, as Ray does.
Arguments Ray accepts for scheduling (``num_cpus``, ``memory``, ``resources``...) become the
read tasks' ``ray_remote_args``. Beyond Ray: paths may be glob patterns, and
``read_parquet(filter=...)`` takes a ``pyarrow.dataset`` expression evaluated in the reader
(Ray 2.60 refuses ``filter=`` there).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np

from torus.data.datasource import csv_json, images, in_memory, numpy_source, text_binary
from torus.data.datasource.custom import Datasource, to_read_task
from torus.data.datasource.file_source import (
    FileShuffleConfig, FileSourceArgs, detect_parallelism, num_blocks_arg)
from torus.data.datasource.parquet import ParquetSource, split_parquet_args
from torus.data.datasource.partitioning import Partitioning, PathPartitionFilter

if TYPE_CHECKING:
    from torus.data.dataset import Dataset, MaterializedDataset

_HIVE = Partitioning("hive")
_JSON_EXTENSIONS = ["json", "jsonl", "json.gz", "jsonl.gz", "json.br", "jsonl.br", "json.zst",
                    "jsonl.zst", "json.lz4", "jsonl.lz4"]
_IMAGE_EXTENSIONS = ["png", "jpg", "jpeg", "tif", "tiff", "bmp", "gif"]
Paths = Union[str, List[str]]


def _dataset():
    from torus.data.dataset import Dataset
    return Dataset


def _remote_args(ray_remote_args: Optional[Dict[str, Any]], num_cpus=None, num_gpus=None,
                 memory=None, resources=None, accelerator_type=None, runtime_env=None,
                 max_calls=None, label_selector=None, **_ignored) -> Dict[str, Any]:
    out = dict(ray_remote_args or {})
    for k, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("memory", memory),
                 ("resources", resources), ("accelerator_type", accelerator_type),
                 ("runtime_env", runtime_env), ("max_calls", max_calls),
                 ("label_selector", label_selector)):
        if v is not None:
            out[k] = v
    return out


def _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
               partitioning, include_paths, ignore_missing_paths, shuffle, file_extensions
               ) -> FileSourceArgs:
    return FileSourceArgs(paths=paths, filesystem=filesystem, partition_filter=partition_filter,
                          partitioning=partitioning, include_paths=include_paths,
                          ignore_missing_paths=ignore_missing_paths, shuffle=shuffle,
                          file_extensions=file_extensions,
                          num_blocks=num_blocks_arg(parallelism, override_num_blocks))


# ---------------------------------------------------------------- generated and in-memory


def range(n: int, *, parallelism: int = -1, concurrency: Optional[int] = None,
          override_num_blocks: Optional[int] = None) -> Dataset:
    """A dataset of ``n`` rows ``{"id": 0 .. n-1}`` (int64).

    Example:
        >>> torus.data.range(5).take(2)
        [{'id': 0}, {'id': 1}]
    """
    tasks, _ = in_memory.range_tasks(n, None, num_blocks_arg(parallelism, override_num_blocks))
    return _dataset()._from_read("ReadRange", tasks, concurrency=concurrency)


def range_tensor(n: int, *, shape: Tuple = (1,), parallelism: int = -1,
                 concurrency: Optional[int] = None,
                 override_num_blocks: Optional[int] = None) -> Dataset:
    """A dataset of ``n`` rows whose column ``data`` is an int64 tensor of ``shape`` filled
    with the row's index; ``take_batch(k)["data"]`` has shape ``(k, *shape)``.

    Example:
        >>> torus.data.range_tensor(4, shape=(2, 2)).take_batch(2)["data"].shape
        (2, 2, 2)
    """
    shape = tuple(int(s) for s in shape)
    tasks, _ = in_memory.range_tasks(n, shape, num_blocks_arg(parallelism, override_num_blocks))
    return _dataset()._from_read("ReadRange", tasks, concurrency=concurrency)


def from_items(items: List[Any], *, parallelism: int = -1,
               override_num_blocks: Optional[int] = None) -> MaterializedDataset:
    """A materialized dataset of ``items``: dicts are rows, other values become
    ``{"item": value}``.

    Example:
        >>> torus.data.from_items([{"a": 1}, {"a": 2}]).count()
        2
    """
    tables = in_memory.items_tables(items, num_blocks_arg(parallelism, override_num_blocks))
    return _dataset()._from_blocks("FromItems", tables)


def from_numpy(ndarrays: Union[np.ndarray, List[np.ndarray]]) -> MaterializedDataset:
    """A materialized dataset with column ``data``: one row per entry of each array's first
    axis (one block per array)."""
    return _dataset()._from_blocks("FromNumpy", in_memory.numpy_tables(ndarrays))


def from_pandas(dfs: Any, override_num_blocks: Optional[int] = None) -> MaterializedDataset:
    """A materialized dataset of one or more pandas DataFrames (one block each)."""
    return _dataset()._from_blocks("FromPandas",
                                   in_memory.pandas_tables(dfs, override_num_blocks))


def from_arrow(tables: Any, *, override_num_blocks: Optional[int] = None) -> MaterializedDataset:
    """A materialized dataset of one or more ``pyarrow.Table`` (one block each)."""
    return _dataset()._from_blocks("FromArrow", in_memory.arrow_tables(tables,
                                                                       override_num_blocks))


def _get_refs(refs: Any) -> List[Any]:
    import torus
    single = not isinstance(refs, (list, tuple))
    values = torus.get([refs] if single else list(refs))
    return values


def from_numpy_refs(ndarrays: Any) -> MaterializedDataset:
    """``from_numpy`` of object refs to numpy arrays."""
    return _dataset()._from_blocks("FromNumpy", in_memory.numpy_tables(_get_refs(ndarrays)))


def from_pandas_refs(dfs: Any) -> MaterializedDataset:
    """``from_pandas`` of object refs to DataFrames."""
    return _dataset()._from_blocks("FromPandas", in_memory.pandas_tables(_get_refs(dfs), None))


def from_arrow_refs(tables: Any) -> MaterializedDataset:
    """``from_arrow`` of object refs to Arrow tables."""
    return _dataset()._from_blocks("FromArrow", in_memory.arrow_tables(_get_refs(tables),
                                                                       None))


def read_datasource(datasource: Datasource, *, parallelism: int = -1,
                    num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
                    memory: Optional[float] = None, concurrency: Optional[int] = None,
                    override_num_blocks: Optional[int] = None,
                    ray_remote_args: Optional[Dict[str, Any]] = None,
                    **read_args: Any) -> Dataset:
    """A dataset read by a custom ``Datasource`` (its ``get_read_tasks(parallelism)``)."""
    requested = num_blocks_arg(parallelism, override_num_blocks)
    n = detect_parallelism(datasource.estimate_inmemory_data_size(), requested)
    tasks = [to_read_task(t) for t in datasource.get_read_tasks(n, **read_args)]
    return _dataset()._from_read(f"Read{datasource.get_name()}", tasks,
                                 ray_remote_args=_remote_args(ray_remote_args, num_cpus,
                                                              num_gpus, memory),
                                 concurrency=concurrency)


# ---------------------------------------------------------------- files


def read_parquet(paths: Paths, *, filesystem=None, catalog=None,
                 columns: Optional[List[str]] = None, parallelism: int = -1,
                 num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
                 memory: Optional[float] = None,
                 tensor_column_schema: Optional[Dict[str, Tuple[np.dtype, Tuple[int, ...]]]]
                 = None, partition_filter: Optional[PathPartitionFilter] = None,
                 partitioning: Optional[Partitioning] = _HIVE,
                 shuffle: Union[str, FileShuffleConfig, None] = None,
                 include_paths: bool = False, include_row_hash: bool = False,
                 file_extensions: Optional[List[str]] = ["parquet"],
                 ignore_missing_paths: bool = False, skip_paths=None,
                 concurrency: Optional[int] = None, override_num_blocks: Optional[int] = None,
                 ray_remote_args: Optional[Dict[str, Any]] = None,
                 **arrow_parquet_args: Any) -> Dataset:
    """Reads Parquet files (a file, directory, glob or list of them; local, ``file://`` or
    any ``pyarrow.fs`` URI) into a dataset, reading only ``columns`` and, with
    ``filter=<pyarrow.dataset expression>``, only the rows passing it (pruned by row-group
    statistics, evaluated in Arrow's reader). Hive partition directories become columns.

    Example:
        >>> import pyarrow.dataset as pds
        >>> ds = torus.data.read_parquet("/data/events", columns=["user", "t"],
        ...                              filter=pds.field("t") > 100)
    """
    if catalog is not None or include_row_hash or skip_paths is not None:
        raise NotImplementedError("read_parquet: catalog, include_row_hash and skip_paths "
                                  "are not supported by Torus")
    remote = _remote_args(ray_remote_args, num_cpus, num_gpus, memory,
                          **_pop_sched(arrow_parquet_args))
    flt, schema, scan_kwargs = split_parquet_args(arrow_parquet_args)
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    source = ParquetSource(args, schema=schema, tensor_column_schema=tensor_column_schema,
                           scan_kwargs=scan_kwargs)
    tasks = source.read_tasks(list(columns) if columns is not None else None, flt)
    return _dataset()._from_read("ReadParquet", tasks, ray_remote_args=remote,
                                 concurrency=concurrency)


_SCHED_KWARGS = ("resources", "accelerator_type", "runtime_env", "max_calls", "label_selector",
                 "fallback_strategy")


def _pop_sched(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The scheduling keywords Ray's readers take (removed from ``kwargs``)."""
    return {k: kwargs.pop(k) for k in _SCHED_KWARGS if k in kwargs}


def read_csv(paths: Paths, *, filesystem=None, parallelism: int = -1,
             num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
             memory: Optional[float] = None,
             arrow_open_stream_args: Optional[Dict[str, Any]] = None,
             partition_filter: Optional[PathPartitionFilter] = None,
             partitioning: Partitioning = _HIVE, include_paths: bool = False,
             ignore_missing_paths: bool = False,
             shuffle: Union[str, FileShuffleConfig, None] = None,
             file_extensions: Optional[List[str]] = None, concurrency: Optional[int] = None,
             override_num_blocks: Optional[int] = None,
             ray_remote_args: Optional[Dict[str, Any]] = None, **arrow_csv_args: Any) -> Dataset:
    """Reads CSV files (header row: column names; types inferred by pyarrow.csv, or set
    through ``read_options=`` / ``parse_options=`` / ``convert_options=``).

    Example:
        >>> torus.data.read_csv("s3://bucket/iris.csv").schema()
    """
    remote = _remote_args(ray_remote_args, num_cpus, num_gpus, memory,
                          **_pop_sched(arrow_csv_args))
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    tasks = csv_json.csv_tasks(args, arrow_open_stream_args, arrow_csv_args)
    return _dataset()._from_read("ReadCSV", tasks, ray_remote_args=remote,
                                 concurrency=concurrency)


def read_json(paths: Paths, *, lines: bool = False, filesystem=None, parallelism: int = -1,
              num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
              memory: Optional[float] = None,
              arrow_open_stream_args: Optional[Dict[str, Any]] = None,
              partition_filter: Optional[PathPartitionFilter] = None,
              partitioning: Partitioning = _HIVE, include_paths: bool = False,
              ignore_missing_paths: bool = False,
              shuffle: Union[str, FileShuffleConfig, None] = None,
              file_extensions: Optional[List[str]] = _JSON_EXTENSIONS,
              concurrency: Optional[int] = None, override_num_blocks: Optional[int] = None,
              ray_remote_args: Optional[Dict[str, Any]] = None,
              **arrow_json_args: Any) -> Dataset:
    """Reads JSON files: JSON lines (one object per line), a JSON array of objects, or one
    object per file; each object is a row.

    Example:
        >>> torus.data.read_json("/data/logs.jsonl", lines=True).count()
    """
    remote = _remote_args(ray_remote_args, num_cpus, num_gpus, memory,
                          **_pop_sched(arrow_json_args))
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    tasks = csv_json.json_tasks(args, arrow_open_stream_args, arrow_json_args)
    return _dataset()._from_read("ReadJSON", tasks, ray_remote_args=remote,
                                 concurrency=concurrency)


def read_text(paths: Paths, *, encoding: str = "utf-8", drop_empty_lines: bool = True,
              filesystem=None, parallelism: int = -1, num_cpus: Optional[float] = None,
              num_gpus: Optional[float] = None, memory: Optional[float] = None,
              arrow_open_stream_args: Optional[Dict[str, Any]] = None,
              partition_filter: Optional[PathPartitionFilter] = None,
              partitioning: Optional[Partitioning] = None, include_paths: bool = False,
              ignore_missing_paths: bool = False,
              shuffle: Union[str, FileShuffleConfig, None] = None,
              file_extensions: Optional[List[str]] = None, concurrency: Optional[int] = None,
              override_num_blocks: Optional[int] = None,
              ray_remote_args: Optional[Dict[str, Any]] = None, **sched: Any) -> Dataset:
    """Reads text files: one row ``{"text": line}`` per line.

    Example:
        >>> torus.data.read_text("/data/corpus.txt").take(1)
    """
    remote = _remote_args(ray_remote_args, num_cpus, num_gpus, memory, **_sched_only(sched))
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    tasks = text_binary.text_tasks(args, encoding=encoding, drop_empty_lines=drop_empty_lines,
                                   arrow_open_stream_args=arrow_open_stream_args)
    return _dataset()._from_read("ReadText", tasks, ray_remote_args=remote,
                                 concurrency=concurrency)


def _sched_only(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    sched = _pop_sched(kwargs)
    if kwargs:
        raise TypeError(f"unexpected keyword argument(s) {sorted(kwargs)}")
    return sched


def read_numpy(paths: Paths, *, filesystem=None, parallelism: int = -1,
               arrow_open_stream_args: Optional[Dict[str, Any]] = None,
               partition_filter: Optional[PathPartitionFilter] = None,
               partitioning: Optional[Partitioning] = None, include_paths: bool = False,
               ignore_missing_paths: bool = False,
               shuffle: Union[str, FileShuffleConfig, None] = None,
               file_extensions: Optional[List[str]] = ["npy"],
               concurrency: Optional[int] = None, override_num_blocks: Optional[int] = None,
               allow_pickle: bool = False, **numpy_load_args: Any) -> Dataset:
    """Reads ``.npy`` files: one row per entry of each array's first axis, column ``data``.

    Example:
        >>> torus.data.read_numpy("/data/features.npy").take_batch(4)["data"].shape
    """
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    tasks = numpy_source.numpy_tasks(args, allow_pickle=allow_pickle,
                                     arrow_open_stream_args=arrow_open_stream_args,
                                     numpy_load_args=numpy_load_args)
    return _dataset()._from_read("ReadNumpy", tasks, concurrency=concurrency)


def read_binary_files(paths: Paths, *, include_paths: bool = False, filesystem=None,
                      parallelism: int = -1, num_cpus: Optional[float] = None,
                      num_gpus: Optional[float] = None, memory: Optional[float] = None,
                      arrow_open_stream_args: Optional[Dict[str, Any]] = None,
                      partition_filter: Optional[PathPartitionFilter] = None,
                      partitioning: Optional[Partitioning] = None,
                      ignore_missing_paths: bool = False,
                      shuffle: Union[str, FileShuffleConfig, None] = None,
                      file_extensions: Optional[List[str]] = None,
                      concurrency: Optional[int] = None,
                      override_num_blocks: Optional[int] = None,
                      ray_remote_args: Optional[Dict[str, Any]] = None, **sched: Any) -> Dataset:
    """Reads files as bytes: one row ``{"bytes": contents}`` per file (``"path"`` too with
    ``include_paths=True``).

    Example:
        >>> torus.data.read_binary_files("/data/blobs", include_paths=True).take(1)
    """
    remote = _remote_args(ray_remote_args, num_cpus, num_gpus, memory, **_sched_only(sched))
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    tasks = text_binary.binary_tasks(args, arrow_open_stream_args)
    return _dataset()._from_read("ReadBinary", tasks, ray_remote_args=remote,
                                 concurrency=concurrency)


def read_images(paths: Paths, *, filesystem=None, parallelism: int = -1,
                num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
                memory: Optional[float] = None,
                arrow_open_file_args: Optional[Dict[str, Any]] = None,
                partition_filter: Optional[PathPartitionFilter] = None,
                partitioning: Optional[Partitioning] = None,
                size: Optional[Tuple[int, int]] = None, mode: Optional[str] = None,
                include_paths: bool = False, ignore_missing_paths: bool = False,
                shuffle: Union[str, FileShuffleConfig, None] = None,
                file_extensions: Optional[List[str]] = _IMAGE_EXTENSIONS,
                concurrency: Optional[int] = None, override_num_blocks: Optional[int] = None,
                ray_remote_args: Optional[Dict[str, Any]] = None, **sched: Any) -> Dataset:
    """Reads image files with Pillow: one row per image, column ``image`` a uint8 array of
    shape (H, W[, C]); ``size=(H, W)`` resizes, ``mode`` ("RGB", "L"...) converts.

    Example:
        >>> torus.data.read_images("/data/imgs", size=(32, 32), mode="RGB").take_batch(8)
    """
    remote = _remote_args(ray_remote_args, num_cpus, num_gpus, memory, **_sched_only(sched))
    args = _file_args(paths, filesystem, parallelism, override_num_blocks, partition_filter,
                      partitioning, include_paths, ignore_missing_paths, shuffle,
                      file_extensions)
    tasks = images.image_tasks(args, size=size, mode=mode,
                               arrow_open_file_args=arrow_open_file_args)
    return _dataset()._from_read("ReadImage", tasks, ray_remote_args=remote,
                                 concurrency=concurrency)


__all__ = ["range", "range_tensor", "from_items", "from_numpy", "from_pandas", "from_arrow",
           "from_numpy_refs", "from_pandas_refs", "from_arrow_refs", "read_datasource",
           "read_parquet", "read_csv", "read_json", "read_text", "read_numpy",
           "read_binary_files", "read_images"]
