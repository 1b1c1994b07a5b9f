"""The consuming half of Dataset (mixed into it): iteration, take/count/schema/show, splits,
writes and stats. Each call runs the plan once (see dataset.py)."""
from __future__ import annotations

import builtins
from typing import Any, Dict, Iterator, List, Optional

import pyarrow as pa

import torus
from torus.data import block as B
from torus.data.iterator import DataIterator


class ConsumeMixin:
    # ---------------------------------------------------------------- iteration
    def _bundles(self, show_progress: Optional[bool] = None):
        ex = self._execute(show_progress)
        try:
            yield from ex.bundles()
        finally:
            ex.close()
            from torus.data.dataset import _stats_text
            self._last_stats = _stats_text(ex)

    def iterator(self) -> DataIterator:
        return DataIterator(self._bundles, name=repr(self))

    def iter_batches(self, *, prefetch_batches: int = 1, batch_size: Optional[int] = 256,
                     batch_format: Optional[str] = "default", drop_last: bool = False,
                     local_shuffle_buffer_size: Optional[int] = None,
                     local_shuffle_seed: Optional[int] = None, _collate_fn=None) -> Iterator[Any]:
        return self.iterator().iter_batches(
            prefetch_batches=prefetch_batches, batch_size=batch_size, batch_format=batch_format,
            drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed, _collate_fn=_collate_fn)

    def iter_rows(self) -> Iterator[Dict[str, Any]]:
        return self.iterator().iter_rows()

    def iter_jax_batches(self, **kwargs) -> Iterator[Dict[str, Any]]:
        return self.iterator().iter_jax_batches(**kwargs)

    def __iter__(self):
        return self.iter_rows()

    # ---------------------------------------------------------------- inspection
    def take_batch(self, batch_size: int = 20, *, batch_format: Optional[str] = "default"):
        for b in self.limit(batch_size).iter_batches(batch_size=batch_size,
                                                     batch_format=batch_format,
                                                     prefetch_batches=0):
            return b
        raise ValueError("The dataset is empty.")

    def take(self, limit: int = 20) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for row in self.limit(limit).iter_rows():
            out.append(row)
            if len(out) >= limit:
                break
        return out

    def take_all(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for row in self.iter_rows():
            out.append(row)
            if limit is not None and len(out) > limit:
                raise ValueError(f"The dataset has more than the given limit of {limit} rows.")
        return out

    def show(self, limit: int = 20) -> None:
        for row in self.take(limit):
            print(row)

    def count(self) -> int:
        src = self._plan.source
        if not self._plan.ops and hasattr(src, "metas"):
            return builtins.sum(m.num_rows for m in src.metas)
        return builtins.sum(b.meta.num_rows for b in self._bundles(show_progress=False))

    def schema(self, fetch_if_missing: bool = True):
        from torus.data.schema import Schema
        src = self._plan.source
        if not self._plan.ops and hasattr(src, "metas"):
            for m in src.metas:
                if m.schema is not None and m.num_rows:
                    return Schema(m.schema)
            return Schema(src.metas[0].schema) if src.metas and src.metas[0].schema else None
        for b in self.limit(1)._bundles(show_progress=False):
            if b.meta.schema is not None:
                return Schema(b.meta.schema)
        return None

    def columns(self, fetch_if_missing: bool = True) -> Optional[List[str]]:
        s = self.schema()
        return list(s.names) if s is not None else None

    def num_blocks(self) -> int:
        src = self._plan.source
        return len(getattr(src, "refs", None) or getattr(src, "tasks", []))

    def size_bytes(self) -> int:
        return builtins.sum(b.meta.size_bytes for b in self._bundles(show_progress=False))

    def input_files(self) -> List[str]:
        src = self._plan.source
        files: List[str] = []
        for t in getattr(src, "tasks", []):
            files.extend(t.input_files)
        for m in getattr(src, "metas", []):
            files.extend(m.input_files)
        return sorted(set(files))

    def stats(self) -> str:
        return self._last_stats or "(the dataset has not been executed yet)"

    def to_pandas(self, limit: Optional[int] = None):
        tables = [torus.get(b.ref) for b in self._bundles()]
        t = B.concat(tables) if tables else pa.table({})
        if limit is not None and t.num_rows > limit:
            raise ValueError(f"the dataset has more than the given limit of {limit} rows: "
                             f"{t.num_rows}")
        return B.to_batch(t, "pandas")

    def to_arrow_refs(self) -> List[Any]:
        return [b.ref for b in self.materialize()._bundles(show_progress=False)]

    # ---------------------------------------------------------------- splits
    def split(self, n: int, *, equal: bool = False, locality_hints=None):
        from torus.data._internal import split as S
        return S.split(self.materialize(), n, equal)

    def split_at_indices(self, indices: List[int]):
        from torus.data._internal import split as S
        return S.split_at_indices(self.materialize(), indices)

    def split_proportionately(self, proportions: List[float]):
        from torus.data._internal import split as S
        return S.split_proportionately(self.materialize(), proportions)

    def train_test_split(self, test_size, *, shuffle: bool = False, seed: Optional[int] = None,
                         stratify=None):
        from torus.data._internal import split as S
        ds = self.random_shuffle(seed=seed) if shuffle else self
        return S.train_test_split(ds.materialize(), test_size)

    def streaming_split(self, n: int, *, equal: bool = False, locality_hints=None):
        from torus.data._internal.streaming_split import streaming_split
        return streaming_split(self, n, equal=equal, locality_hints=locality_hints)

    # ---------------------------------------------------------------- writes
    def _write(self, fmt: str, path: str, **kwargs) -> None:
        from torus.data.datasource.sinks import write_dataset
        write_dataset(self, fmt, path, **kwargs)

    def write_parquet(self, path: str, **kwargs) -> None:
        self._write("parquet", path, **kwargs)

    def write_csv(self, path: str, **kwargs) -> None:
        self._write("csv", path, **kwargs)

    def write_json(self, path: str, **kwargs) -> None:
        self._write("json", path, **kwargs)

    def write_numpy(self, path: str, *, column: str, **kwargs) -> None:
        self._write("numpy", path, column=column, **kwargs)
