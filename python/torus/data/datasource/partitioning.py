"""Path-based partitioning, as Ray Data's ``ray.data.datasource`` exposes it.

``Partitioning`` describes how partition values sit in directory names: ``"hive"``
(``.../year=2020/month=1/file``, the default of the Parquet/CSV/JSON readers) or ``"dir"``
(``base/2020/1/file`` with ``field_names=["year", "month"]``). The readers add one column per
partition field to every block of a file (strings, or ``field_types``), as Ray does.
``PathPartitionFilter`` drops files by their partition values before any task is planned.

Plain data: instances are pickled into read tasks.
"""
from __future__ import annotations

import posixpath
import urllib.parse
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Type

import pyarrow as pa
import pyarrow.compute as pc


class PartitionStyle(str, Enum):
    """Where a partitioned path keeps its values."""

    HIVE = "hive"
    DIRECTORY = "dir"


@dataclass
class Partitioning:
    """How partition values are encoded in file paths.

    Example:
        >>> Partitioning("hive")                                  # year=2020/...
        >>> Partitioning("dir", base_dir="/data", field_names=["year", "month"])
    """

    style: PartitionStyle
    base_dir: Optional[str] = None
    field_names: Optional[List[str]] = None
    field_types: Optional[Dict[str, Type[Any]]] = field(default_factory=dict)
    filesystem: Optional[Any] = None
    _normalized: Optional[str] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.style = PartitionStyle("dir" if self.style == "dirs" else self.style)
        if self.base_dir is None:
            self.base_dir = ""
        if self.field_types is None:
            self.field_types = {}

    @property
    def normalized_base_dir(self) -> str:
        """``base_dir`` as its filesystem names it (no scheme, absolute locally), ending in
        ``/``; empty: any path."""
        if self._normalized is None:
            base = ""
            if self.base_dir:
                from torus.data.datasource.paths import resolve_filesystem
                _, (base,) = resolve_filesystem(self.base_dir, self.filesystem)
                base = base if base.endswith("/") else base + "/"
            self._normalized = base  # cached: pickled with the object into read tasks
        return self._normalized


class PathPartitionParser:
    """Callable: a file path -> its partition values ``{field: value}`` (empty if none)."""

    def __init__(self, partitioning: Partitioning):
        if partitioning.style == PartitionStyle.DIRECTORY and not partitioning.field_names:
            raise ValueError("Directory partitioning requires a corresponding list of "
                             "partition key field names. Please retry your request with one "
                             "or more field names specified.")
        self._p = partitioning
        self._base = partitioning.normalized_base_dir

    @classmethod
    def of(cls, style: str = "hive", base_dir: Optional[str] = None,
           field_names: Optional[List[str]] = None,
           field_types: Optional[Dict[str, Type[Any]]] = None,
           filesystem: Optional[Any] = None) -> "PathPartitionParser":
        return cls(Partitioning(style, base_dir, field_names, field_types, filesystem))

    def __call__(self, path: str) -> Dict[str, Any]:
        if not path.startswith(self._base):
            return {}
        dir_path = posixpath.dirname(path[len(self._base):])
        if self._p.style == PartitionStyle.HIVE:
            values = self._hive(dir_path)
        else:
            values = self._dirs(dir_path)
        types = self._p.field_types or {}
        return {k: (types[k](v) if k in types else v) for k, v in values.items()}

    def _hive(self, dir_path: str) -> Dict[str, str]:
        pairs = [d.split("=") for d in dir_path.split("/") if d and d.count("=") == 1]
        # Writers URL-encode values on object stores; decode so values round-trip.
        pairs = [(k, urllib.parse.unquote(v)) for k, v in pairs]
        names = self._p.field_names
        if names and pairs:
            if len(pairs) != len(names):
                raise ValueError(f"Expected {len(names)} partition value(s) but found "
                                 f"{len(pairs)}: {pairs}.")
            for (k, _), name in zip(pairs, names):
                if k != name:
                    raise ValueError(f"Expected partition key {name} but found {k}")
        return dict(pairs)

    def _dirs(self, dir_path: str) -> Dict[str, str]:
        dirs = [d for d in dir_path.split("/") if d]
        names = self._p.field_names or []
        if dirs and len(dirs) != len(names):
            raise ValueError(f"Expected {len(names)} partition value(s) but found "
                             f"{len(dirs)}: {dirs}.")
        return dict(zip(names, dirs)) if dirs else {}


class PathPartitionFilter:
    """Callable: a list of paths -> those whose partition values pass ``filter_fn``.

    Example:
        >>> PathPartitionFilter.of(lambda v: v["year"] == "2021")
    """

    def __init__(self, path_partition_parser: PathPartitionParser,
                 filter_fn: Callable[[Dict[str, Any]], bool]):
        self._parser = path_partition_parser
        self._fn = filter_fn

    @classmethod
    def of(cls, filter_fn: Callable[[Dict[str, Any]], bool], style: str = "hive",
           base_dir: Optional[str] = None, field_names: Optional[List[str]] = None,
           field_types: Optional[Dict[str, Type[Any]]] = None,
           filesystem: Optional[Any] = None) -> "PathPartitionFilter":
        parser = PathPartitionParser.of(style, base_dir, field_names, field_types, filesystem)
        return cls(parser, filter_fn)

    def apply(self, path: str) -> bool:
        return bool(self._fn(self._parser(path)))

    def __call__(self, paths: List[str]) -> List[str]:
        return [p for p in paths if self.apply(p)]


def add_partition_columns(table: pa.Table, values: Dict[str, Any]) -> pa.Table:
    """Appends one constant column per partition field (or checks an existing column holds
    that value, as Ray does, and casts the value to its type)."""
    n = table.num_rows
    for name, value in values.items():
        col = pa.repeat(value, n)
        if name in table.column_names:
            target = table.schema.field(name).type
            try:
                col = col.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ValueError(f"Partition value {value!r} for field {name!r} cannot be "
                                 f"cast to target type {target}.") from e
            if n and not pc.all(pc.equal(col, table[name])).as_py():
                raise ValueError(
                    f"Partition column {name} exists in table data, but partition value "
                    f"'{value}' is different from in-data values: "
                    f"{table[name].unique().to_pylist()}.")
            table = table.set_column(table.schema.get_field_index(name), name, col)
        else:
            table = table.append_column(name, col)
    return table
