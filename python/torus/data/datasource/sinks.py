"""File sinks: ``Dataset.write_parquet / write_csv / write_json / write_numpy``.

``write_dataset`` runs the dataset through one ``map_batches`` call per block (the public
Dataset API, so the write streams and runs where the blocks are); each call writes its block
to a file under a temporary unique name and returns the names, and the driver then renames
the files in dataset order to Ray 2.60's shape ``{dataset_uuid}_{write_uuid}_{index:06}.{ext}``
(Parquet: ``..._{index:06}-{i}.parquet``, ``i`` counting the files of one block cut by
``max_rows_per_file``), or to ``filename_provider.get_filename_for_task(write_uuid, index)``.
The names are final when ``write_dataset`` returns (object stores rename by a server-side
copy). A block is one file: ``min_rows_per_file`` makes map_batches cut batches of that many
rows instead (Ray merges blocks up to it and never cuts one; file counts may differ).

``mode`` (Ray's SaveMode): "append" (default), "overwrite" (the directory's contents are
deleted first), "error"/"create" (refuse an existing path), "ignore" (skip the write).
"""
from __future__ import annotations

import functools
import io
import logging
import posixpath
import uuid
from enum import Enum
from typing import Any, Callable, Dict, List, Optional

import pyarrow as pa
import pyarrow.fs as pafs

from torus.data.datasource.paths import resolve_filesystem

logger = logging.getLogger(__name__)

_EXT = {"parquet": "parquet", "csv": "csv", "json": "json", "numpy": "npy"}
_TMP_TAG = "tmp"  # in a temporary name: {ds}_{write}_tmp{block id}


class SaveMode(str, Enum):
    """What a write does when its path exists (Ray's ``SaveMode``)."""

    CREATE = "create"
    APPEND = "append"
    OVERWRITE = "overwrite"
    IGNORE = "ignore"
    ERROR = "error"


def write_dataset(ds: Any, fmt: str, path: str, *, filesystem: Optional[pafs.FileSystem] = None,
                  try_create_dir: bool = True, min_rows_per_file: Optional[int] = None,
                  ray_remote_args: Optional[Dict[str, Any]] = None,
                  concurrency: Optional[int] = None,
                  arrow_open_stream_args: Optional[Dict[str, Any]] = None,
                  filename_provider: Any = None, num_rows_per_file: Optional[int] = None,
                  mode: Any = SaveMode.APPEND, **fmt_options: Any) -> None:
    """Writes ``ds`` as files of format ``fmt`` ("parquet", "csv", "json", "numpy") under the
    directory ``path``; returns when every file is written.

    Example:
        >>> write_dataset(torus.data.range(100), "parquet", "/tmp/out")
    """
    if fmt not in _EXT:
        raise ValueError(f"unknown write format {fmt!r} (one of {sorted(_EXT)})")
    if num_rows_per_file is not None and min_rows_per_file is None:
        min_rows_per_file = num_rows_per_file
    fs, (root,) = resolve_filesystem(path, filesystem)
    if not _prepare_dir(fs, root, SaveMode(mode), try_create_dir):
        return
    ds_uuid = str(getattr(ds, "_uuid", None) or uuid.uuid4().hex)
    write_uuid = uuid.uuid4().hex
    writer = functools.partial(
        _write_block, fs=fs, root=root, fmt=fmt, prefix=f"{ds_uuid}_{write_uuid}",
        open_args=dict(arrow_open_stream_args or {}), options=_format_options(fmt, fmt_options))
    writer.__name__ = "Write"  # the operator's name in progress bars and stats
    out = ds.map_batches(writer, batch_format="pyarrow",
                         batch_size=min_rows_per_file if min_rows_per_file else None,
                         concurrency=concurrency, **dict(ray_remote_args or {}))
    written: List[Dict[str, Any]] = out.take_all()
    rows = sum(int(r["num_rows"]) for r in written)
    _finalize_names(fs, written, fmt, ds_uuid, write_uuid, filename_provider)
    logger.info("Data sink %s finished. %d rows written.", fmt.capitalize(), rows)


def _prepare_dir(fs: pafs.FileSystem, root: str, mode: SaveMode, create: bool) -> bool:
    """Applies ``mode`` to an existing ``root``; False: skip the write (mode "ignore")."""
    exists = fs.get_file_info(root).type != pafs.FileType.NotFound
    if exists:
        if mode in (SaveMode.ERROR, SaveMode.CREATE):
            raise ValueError(f"Path {root} already exists. If this is unexpected, use "
                             f"mode='ignore' to ignore those files")
        if mode == SaveMode.IGNORE:
            logger.warning("[SaveMode=%s] Skipping %s", mode.value, root)
            return False
        if mode == SaveMode.OVERWRITE:
            fs.delete_dir_contents(root)
    if create and not isinstance(fs, pafs.S3FileSystem):
        fs.create_dir(root, recursive=True)
    return True


def _format_options(fmt: str, opts: Dict[str, Any]) -> Dict[str, Any]:
    """Checks a format's keyword arguments (Ray's names) on the driver."""
    opts = dict(opts)
    fn_arg = {"parquet": "arrow_parquet_args_fn", "csv": "arrow_csv_args_fn",
              "json": "pandas_json_args_fn"}.get(fmt)
    if fn_arg and opts.get(fn_arg) is not None:
        extra = opts.pop(fn_arg)()
        opts.update(extra or {})
    else:
        opts.pop(fn_arg, None)
    allowed = {"parquet": None, "csv": None, "json": None, "numpy": {"column"}}[fmt]
    if allowed is not None:
        bad = [k for k in opts if k not in allowed]
        if bad:
            raise TypeError(f"write_{fmt}() got unexpected keyword argument(s) {bad}")
    if fmt == "numpy" and "column" not in opts:
        raise TypeError("write_numpy() missing required keyword argument: 'column'")
    return opts


# ---------------------------------------------------------------- worker side


def _write_block(table: pa.Table, *, fs: pafs.FileSystem, root: str, fmt: str, prefix: str,
                 open_args: Dict[str, Any], options: Dict[str, Any]) -> pa.Table:
    """Writes one block (map_batches' function); returns the files written and row count."""
    if table.num_rows == 0:
        return pa.table({"path": pa.array([], pa.string()), "num_rows": pa.array([], pa.int64())})
    base = f"{prefix}_{_TMP_TAG}{uuid.uuid4().hex[:16]}"
    if fmt == "parquet":
        paths = _write_parquet(table, fs, root, base, options)
    else:
        path = posixpath.join(root, f"{base}.{_EXT[fmt]}")
        with fs.open_output_stream(path, **open_args) as f:
            _WRITERS[fmt](table, f, options)
        paths = [path]
    return pa.table({"path": pa.array(paths, pa.string()),
                     "num_rows": pa.array([table.num_rows] + [0] * (len(paths) - 1),
                                          pa.int64())})


def _write_parquet(table: pa.Table, fs: pafs.FileSystem, root: str, base: str,
                   options: Dict[str, Any]) -> List[str]:
    import pyarrow.dataset as pds
    opts = dict(options)
    partition_cols = opts.pop("partition_cols", None)
    max_rows = opts.pop("max_rows_per_file", None)
    opts.pop("min_bytes_per_file", None)
    row_group_size = opts.pop("row_group_size", None)
    fmt = pds.ParquetFileFormat()
    written: List[str] = []
    kwargs: Dict[str, Any] = {}
    if max_rows:
        kwargs["max_rows_per_file"] = int(max_rows)
        kwargs["max_rows_per_group"] = min(int(max_rows), int(row_group_size or max_rows))
    elif row_group_size:
        kwargs["max_rows_per_group"] = int(row_group_size)
        kwargs["min_rows_per_group"] = int(row_group_size)
    pds.write_dataset(
        table, root, basename_template=f"{base}-{{i}}.parquet", format=fmt,
        file_options=fmt.make_write_options(**opts), filesystem=fs,
        partitioning=list(partition_cols) if partition_cols else None,
        partitioning_flavor="hive" if partition_cols else None,
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=lambda wf: written.append(wf.path), use_threads=True, **kwargs)
    return sorted(written)


def _write_csv(table: pa.Table, f: Any, options: Dict[str, Any]) -> None:
    import pyarrow.csv as pacsv
    opts = dict(options)
    write_options = opts.pop("write_options", None)
    if write_options is None and opts:
        write_options = pacsv.WriteOptions(**opts)
    pacsv.write_csv(table, f, write_options=write_options)


def _write_json(table: pa.Table, f: Any, options: Dict[str, Any]) -> None:
    from torus.data.block import to_batch
    opts = {"orient": "records", "lines": True, **options}
    buf = io.StringIO()
    to_batch(table, "pandas").to_json(buf, **opts)
    text = buf.getvalue()
    if opts.get("lines") and text and not text.endswith("\n"):
        text += "\n"
    f.write(text.encode("utf-8"))


def _write_numpy(table: pa.Table, f: Any, options: Dict[str, Any]) -> None:
    import numpy as np
    from torus.data.block import column_to_numpy
    column = options["column"]
    if column not in table.column_names:
        raise ValueError(f"write_numpy: no column {column!r} (columns: {table.column_names})")
    buf = io.BytesIO()
    np.save(buf, column_to_numpy(table.column(column)))
    f.write(buf.getvalue())


_WRITERS: Dict[str, Callable[[pa.Table, Any, Dict[str, Any]], None]] = {
    "csv": _write_csv, "json": _write_json, "numpy": _write_numpy}


# ---------------------------------------------------------------- driver side, after


def _finalize_names(fs: pafs.FileSystem, written: List[Dict[str, Any]], fmt: str,
                    ds_uuid: str, write_uuid: str, filename_provider: Any) -> None:
    """Renames each block's ``..._tmp{id}`` files to their final names, in dataset order:
    ``{ds_uuid}_{write_uuid}_{index:06}`` or ``filename_provider.get_filename_for_task``."""
    ext = _EXT[fmt]
    index: Dict[str, int] = {}
    for row in written:
        path = row["path"]
        name = posixpath.basename(path)
        marker = name.find("_" + _TMP_TAG)
        if marker < 0:
            continue
        tmp = name[:marker] + "_" + _TMP_TAG + name[marker + 1 + len(_TMP_TAG):][:16]
        i = index.setdefault(tmp, len(index))
        if filename_provider is not None:
            final = filename_provider.get_filename_for_task(write_uuid, i)
            if final.endswith("." + ext):
                final = final[:-len(ext) - 1]
        else:
            final = f"{ds_uuid}_{write_uuid}_{i:06d}"
        fs.move(path, posixpath.join(posixpath.dirname(path), name.replace(tmp, final, 1)))
