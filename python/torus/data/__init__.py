"""`torus.data`: Ray Data's API (Ray 2.60 names and semantics) on Torus (docs/data.md).

    import ray
    ds = ray.data.read_parquet("s3://bucket/dir").map_batches(preprocess, batch_size=1024)
    for batch in ds.iter_batches(batch_size=256):
        ...

Datasets are lazy and stream: blocks (Arrow tables in the shared-memory object store) flow
through fused read/map tasks and actor pools within an object store budget. Under
`python -m torus.ray`, `ray.data` is this package.
"""
from __future__ import annotations

from torus.data.context import DataContext, ExecutionOptions, ExecutionResources

# Imported on first use: a worker that runs a read or map task loads only what the task needs
# (its start-up is paid by the first task it runs).
_LAZY = {"Dataset": "torus.data.dataset", "MaterializedDataset": "torus.data.dataset",
         "DataIterator": "torus.data.iterator", "Schema": "torus.data.schema",
         "ReadTask": "torus.data._internal.read_task"}
_SUBMODULES = ("aggregate", "expressions", "datasource", "block", "context", "dataset",
               "iterator", "grouped_data", "read_api", "schema")


class ActorPoolStrategy:
    """``compute=ActorPoolStrategy(min_size=, max_size=)`` (Ray's older spelling of
    ``concurrency=(min, max)``)."""

    def __init__(self, *, size: int = None, min_size: int = None, max_size: int = None,
                 max_tasks_in_flight_per_actor: int = None):
        if size is not None:
            min_size = max_size = size
        self.min_size = min_size or 1
        self.max_size = max_size or self.min_size
        if self.min_size < 1 or self.max_size < self.min_size:
            raise ValueError(f"ActorPoolStrategy: need 1 <= min_size <= max_size, got "
                             f"{self.min_size}, {self.max_size}")


class TaskPoolStrategy:
    def __init__(self, size: int = None):
        self.size = size


_READ_API = ("range", "range_tensor", "from_items", "from_numpy", "from_pandas", "from_arrow",
             "read_parquet", "read_csv", "read_json", "read_text", "read_numpy",
             "read_binary_files", "read_images", "from_numpy_refs", "from_pandas_refs",
             "from_arrow_refs", "read_datasource")


def __getattr__(name):
    import importlib
    if name in _READ_API:
        return getattr(importlib.import_module("torus.data.read_api"), name)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"torus.data.{name}")
    raise AttributeError(f"module 'torus.data' has no attribute {name!r}")


__all__ = ["ActorPoolStrategy", "DataContext", "DataIterator", "Dataset", "ExecutionOptions",
           "ExecutionResources", "MaterializedDataset", "ReadTask", "Schema", "TaskPoolStrategy",
           "aggregate", *_READ_API]
