"""ReadTask: one unit of reading, run as a remote task by the streaming executor.

A source (datasource/) turns its input into a list of ReadTasks before anything runs; the
executor runs each as one task (fused with the map operators after the read), in order,
within the object store budget. A ReadTask's function runs on a worker: it and everything it
closes over are pickled (keep them small: paths and options, never data).

Contract of ``read_fn``: called with no arguments on a worker, returns an iterable of
``pyarrow.Table`` blocks (a generator is best: the executor consumes it block by block and
cuts or concatenates to DataContext.target_max_block_size). Raising fails the task (retried
``DataContext.max_read_retries`` times, then the dataset fails with the exception's type and
message).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional

import pyarrow as pa


@dataclass
class ReadTask:
    read_fn: Callable[[], Iterable[pa.Table]]
    num_rows: Optional[int] = None        # an estimate where the source knows (None: unknown)
    size_bytes: Optional[int] = None      # in-memory size estimate (None: unknown)
    input_files: List[str] = field(default_factory=list)
    schema: Optional[pa.Schema] = None    # when known without reading

    def __call__(self) -> Iterable[pa.Table]:
        return self.read_fn()
