"""The physical operators of the streaming executor (executor.py drives them).

Each stage takes Bundles (a block's ref and metadata) in order and emits Bundles in the same
order. ``TaskStage`` runs a read or a chain of fused maps as one task per input; ``PoolStage``
runs a chain on an autoscaling pool of actors; ``LimitStage`` truncates; ``BarrierStage`` runs
an all-to-all operator once it has every input. Stages are driven by one executor thread:
nothing here is thread-safe.
"""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Any, Deque, List, Optional

import torus
from torus.data import block as B
from torus.data._internal import transforms
from torus.data._internal.plan import AllToAll, MapSpec


@dataclass
class Bundle:
    ref: Any
    meta: B.BlockMetadata


@torus.remote
def _chain_task(ctx, chain, num_blocks, input_files, *sources):
    from torus.data.context import DataContext
    DataContext._set_current(ctx)   # the driver's context reaches the UDFs (as Ray's does)
    return transforms.run_chain(sources, chain, num_blocks, input_files)


class Stage:
    name = ""

    def __init__(self):
        self.inputs: Deque[Any] = collections.deque()
        self.outputs: Deque[Bundle] = collections.deque()
        self.inputs_done = False
        self.finished = False        # no more outputs will come (beyond those queued)
        self.blocks_out = 0
        self.rows_out = 0
        self.started = None
        self.busy_s = 0.0

    def running(self) -> int:
        return 0

    def waitables(self) -> List[Any]:
        return []

    def on_ready(self, ready: set) -> None:
        pass

    def next_cost(self) -> int:
        """Bytes the next launch may add to the store (its output estimate)."""
        return 0

    def can_launch(self) -> bool:
        return False

    def launch(self) -> int:
        """Starts one unit of work; returns the bytes it is expected to produce."""
        return 0

    def running_bytes(self) -> int:
        return 0

    def cpus_per_unit(self) -> float:
        """CPUs one running unit of work holds (a task; a pool's actors are counted apart)."""
        return 0.0

    def emit(self, b: Bundle) -> None:
        self.outputs.append(b)
        self.blocks_out += 1
        self.rows_out += b.meta.num_rows

    def shutdown(self) -> None:
        pass


class TaskStage(Stage):
    """A read (inputs are ReadTasks) or maps (inputs are Bundles), fused: one task per input."""

    def __init__(self, name: str, chain: List[MapSpec], remote_args: dict, max_in_flight: int,
                 target_block: int, retries: int, ctx=None):
        super().__init__()
        self.ctx = ctx
        self.name = name
        self.chain = chain
        self.max_in_flight = max_in_flight
        self.target_block = target_block
        self.custom = bool(remote_args)
        opts = dict(remote_args)
        opts.setdefault("num_cpus", 1)
        opts.setdefault("max_retries", retries)
        self.opts = opts
        self._running: Deque[tuple] = collections.deque()  # (block refs, meta ref, est bytes, t0)
        self._ready: set = set()
        self._ratio = 1.0          # output bytes / input bytes seen so far
        self._avg_out: Optional[float] = None

    def opts_custom(self) -> bool:
        return self.custom

    def cpus_per_unit(self) -> float:
        return float(self.opts.get("num_cpus", 1))

    def running(self) -> int:
        return len(self._running)

    def running_bytes(self) -> int:
        return sum(r[2] for r in self._running)

    def _estimate(self, item) -> int:
        if isinstance(item, Bundle):
            return int(item.meta.size_bytes * self._ratio)
        if item.size_bytes is not None:
            return int(item.size_bytes * self._ratio)
        return int(self._avg_out or self.target_block)

    def _min_rows(self) -> int:
        """Rows one map task should get: a first map_batches' batch_size, so that small
        blocks are combined into whole batches (Ray bundles its inputs the same way)."""
        if not self.chain or self.chain[0].kind != "map_batches":
            return 0
        size = self.chain[0].batch_size
        return transforms.DEFAULT_BATCH_SIZE if size == "default" else (size or 0)

    def _take_inputs(self) -> List[Any]:
        """The inputs of the next task: a ReadTask, or blocks up to _min_rows() rows."""
        first = self.inputs.popleft()
        items = [first]
        if isinstance(first, Bundle):
            rows, want = first.meta.num_rows, self._min_rows()
            while rows < want and self.inputs:
                items.append(self.inputs.popleft())
                rows += items[-1].meta.num_rows
        return items

    def next_cost(self) -> int:
        return self._estimate(self.inputs[0]) if self.inputs else 0

    def can_launch(self) -> bool:
        if not self.inputs or len(self._running) >= self.max_in_flight:
            return False
        want = self._min_rows()
        if not want or self.inputs_done or not isinstance(self.inputs[0], Bundle):
            return True
        return sum(b.meta.num_rows for b in self.inputs) >= want

    def launch(self) -> int:
        items = self._take_inputs()
        est = sum(self._estimate(i) for i in items)
        if isinstance(items[0], Bundle):
            srcs = [b.ref for b in items]
            files = [f for b in items for f in (b.meta.input_files or [])]
            in_bytes, k = sum(b.meta.size_bytes for b in items), 1
        else:
            srcs, files, in_bytes = items, items[0].input_files, None
            k = max(1, math.ceil((items[0].size_bytes or 0) / self.target_block))
        refs = _chain_task.options(num_returns=k + 1, **self.opts).remote(
            self.ctx, self.chain, k, files, *srcs)
        self._running.append((refs[:-1], refs[-1], est, time.perf_counter(), in_bytes))
        return est

    def waitables(self) -> List[Any]:
        return [r[1] for r in self._running if r[1] not in self._ready]

    def on_ready(self, ready: set) -> None:
        self._ready |= ready & {r[1] for r in self._running}
        while self._running and self._running[0][1] in self._ready:
            blocks, meta_ref, est, t0, in_bytes = self._running.popleft()
            self._ready.discard(meta_ref)
            metas = torus.get(meta_ref)
            self.busy_s += time.perf_counter() - t0
            out = sum(m.size_bytes for m in metas)
            if in_bytes:
                self._ratio = 0.8 * self._ratio + 0.2 * (out / max(1, in_bytes))
            self._avg_out = out if self._avg_out is None else 0.8 * self._avg_out + 0.2 * out
            for ref, m in zip(blocks, metas):
                if m.num_rows or not self.chain or len(metas) == 1:
                    self.emit(Bundle(ref, m))
        if self.inputs_done and not self.inputs and not self._running:
            self.finished = True


class LimitStage(Stage):
    def __init__(self, n: int):
        super().__init__()
        self.name = f"limit={n}"
        self.left = n

    def can_launch(self) -> bool:
        return bool(self.inputs) and not self.finished

    def launch(self) -> int:
        b = self.inputs.popleft()
        if self.left <= 0:
            self.finished = True
            return 0
        if b.meta.num_rows > self.left:
            t = torus.get(b.ref).slice(0, self.left)
            b = Bundle(torus.put(t), B.BlockMetadata.of(t, b.meta.input_files))
        self.left -= b.meta.num_rows
        self.emit(b)
        if self.left <= 0:
            self.finished = True
        return 0

    def on_ready(self, ready: set) -> None:
        if self.inputs_done and not self.inputs:
            self.finished = True


class BarrierStage(Stage):
    def __init__(self, op: AllToAll, ctx):
        super().__init__()
        self.name = op.name
        self.op = op
        self.ctx = ctx

    def can_launch(self) -> bool:
        return self.inputs_done and not self.finished

    def launch(self) -> int:
        t0 = time.perf_counter()
        items = list(self.inputs)
        self.inputs.clear()
        refs, metas = self.op.run([b.ref for b in items], [b.meta for b in items], self.ctx)
        del items
        for r, m in zip(refs, metas):
            self.emit(Bundle(r, m))
        self.busy_s += time.perf_counter() - t0
        self.finished = True
        return 0
