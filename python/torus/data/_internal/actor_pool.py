"""PoolStage: a map operator on an autoscaling pool of actors (``concurrency=n`` or
``(min, max)`` with a callable class), as Ray Data's ActorPoolStrategy.

Each actor constructs the UDF once and maps one block per call. Calls go to ready actors
only, at most ``max_tasks_in_flight_per_actor`` each, the least loaded first. A pool right
after a read runs the read too (its inputs are the ReadTasks, and the maps fused into the
read before it run first), as Ray does: the reads then run on every actor at once instead of
waiting for CPUs the actors hold. The pool starts
with ``min`` actors, adds one while inputs wait and every ready actor is full (up to ``max``,
and only while no actor is still starting), and removes actors idle for
``actor_pool_idle_timeout_s`` beyond ``min``; all of them when the stage ends. Outputs keep the
input order. Executor thread only.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Deque, Dict, List

import torus
from torus.data._internal import transforms
from torus.data._internal.plan import MapSpec
from torus.data._internal.stages import Bundle, Stage


@torus.remote
class _MapActor:
    def __init__(self, spec: MapSpec, ctx, pre_chain=()):
        from torus.data.context import DataContext
        DataContext._set_current(ctx)   # the driver's context, as in its tasks
        self.spec = spec
        self.chain = list(pre_chain) + [spec]
        transforms.udf_instance(spec)   # the constructor runs now: its errors surface at start

    def ready(self) -> bool:
        return True

    def map_blocks(self, input_files, *sources):
        return transforms.run_chain(sources, self.chain, 1, input_files)


class _Actor:
    def __init__(self, handle, ready_ref):
        self.handle = handle
        self.ready_ref = ready_ref
        self.ready = False
        self.in_flight = 0
        self.idle_since = time.monotonic()


class PoolStage(Stage):
    def __init__(self, spec: MapSpec, ctx, pre_chain=(), name: str = ""):
        super().__init__()
        self.spec = spec
        self.pre_chain = list(pre_chain)
        self.name = name or spec.name
        self.min, self.max = spec.pool
        self.per_actor = max(1, ctx.max_tasks_in_flight_per_actor)
        self.idle_timeout = ctx.actor_pool_idle_timeout_s
        self.ctx = ctx
        opts = dict(spec.ray_remote_args)
        opts.setdefault("num_cpus", 1)
        # As Ray Data's pools: an actor whose process dies restarts and its calls run again.
        opts.setdefault("max_restarts", -1)
        opts.setdefault("max_task_retries", -1)
        self.opts = opts
        self.actors: List[_Actor] = []
        self._running: Deque[tuple] = collections.deque()  # (block ref, meta ref, actor, est)
        self._ready: set = set()
        self._ratio = 1.0
        for _ in range(self.min):
            self._add_actor()

    def _add_actor(self) -> None:
        h = _MapActor.options(**self.opts).remote(self.spec, self.ctx, self.pre_chain)
        self.actors.append(_Actor(h, h.ready.remote()))

    def running(self) -> int:
        return len(self._running)

    def running_bytes(self) -> int:
        return sum(r[3] for r in self._running)

    @staticmethod
    def _bytes(item) -> int:
        if isinstance(item, Bundle):
            return item.meta.size_bytes
        return item.size_bytes or 0   # a ReadTask's estimate

    def next_cost(self) -> int:
        return int(self._bytes(self.inputs[0]) * self._ratio) if self.inputs else 0

    def _free_actor(self):
        ready = [a for a in self.actors if a.ready and a.in_flight < self.per_actor]
        return min(ready, key=lambda a: a.in_flight) if ready else None

    def can_launch(self) -> bool:
        if not self.inputs:
            return False
        want = self._min_rows() if isinstance(self.inputs[0], Bundle) else 0
        if want and not self.inputs_done and sum(b.meta.num_rows for b in self.inputs) < want:
            return False
        if self._free_actor() is not None:
            return True
        starting = any(not a.ready for a in self.actors)
        if not starting and len(self.actors) < self.max:
            self._add_actor()
        return False

    def _min_rows(self) -> int:
        size = self.spec.batch_size if self.spec.kind == "map_batches" else None
        return transforms.DEFAULT_BATCH_SIZE if size == "default" else (size or 0)

    def launch(self) -> int:
        items = [self.inputs.popleft()]
        if isinstance(items[0], Bundle):
            rows, want = items[0].meta.num_rows, self._min_rows()
            while rows < want and self.inputs:
                items.append(self.inputs.popleft())
                rows += items[-1].meta.num_rows
            files = [f for b in items for f in (b.meta.input_files or [])]
            sources = [b.ref for b in items]
        else:  # a ReadTask: the actor reads
            files, sources = list(items[0].input_files), items
        a = self._free_actor()
        a.in_flight += 1
        in_bytes = sum(self._bytes(i) for i in items)
        est = int(in_bytes * self._ratio)
        block_ref, meta_ref = a.handle.map_blocks.options(num_returns=2).remote(files, *sources)
        self._running.append((block_ref, meta_ref, a, est, in_bytes, time.perf_counter()))
        return est

    def waitables(self) -> List[Any]:
        out = [a.ready_ref for a in self.actors if not a.ready]
        return out + [r[1] for r in self._running if r[1] not in self._ready]

    def on_ready(self, ready: set) -> None:
        for a in self.actors:
            if not a.ready and a.ready_ref in ready:
                torus.get(a.ready_ref)  # a constructor that raised raises here
                a.ready = True
                a.idle_since = time.monotonic()
        self._ready |= ready & {r[1] for r in self._running}
        while self._running and self._running[0][1] in self._ready:
            block_ref, meta_ref, a, est, in_bytes, t0 = self._running.popleft()
            self._ready.discard(meta_ref)
            metas = torus.get(meta_ref)
            self.busy_s += time.perf_counter() - t0
            a.in_flight -= 1
            if a.in_flight == 0:
                a.idle_since = time.monotonic()
            m = metas[0]
            self._ratio = 0.8 * self._ratio + 0.2 * (m.size_bytes / max(1, in_bytes))
            self.emit(Bundle(block_ref, m))
        self._scale_down()
        if self.inputs_done and not self.inputs and not self._running:
            self.finished = True
            self.shutdown()

    def _scale_down(self) -> None:
        now = time.monotonic()
        for a in list(self.actors):
            if len(self.actors) <= self.min:
                break
            if a.ready and a.in_flight == 0 and now - a.idle_since > self.idle_timeout:
                self.actors.remove(a)
                torus.kill(a.handle)

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                torus.kill(a.handle)
            except Exception:
                pass
        self.actors = []

    def stats(self) -> Dict[str, int]:
        return {"actors": len(self.actors)}
