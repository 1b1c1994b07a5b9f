"""The streaming executor: runs a Plan as a pipeline of stages on one background thread and
hands the final blocks, in order, to the consumer through a bounded queue.

Fusion: the source and the task-based maps after it run as one task per input; a map on an
actor pool, a limit and each all-to-all operator start a new stage.

Backpressure (memory): the bytes of blocks made but not yet consumed (queued between stages,
waiting for the consumer, held by the consumer) plus the estimated outputs of running tasks
stay within the budget: DataContext.execution_options.resource_limits.object_store_memory, else
``object_store_memory_fraction`` of the cluster's object stores. A stage may exceed it only to
keep one task running when nothing it made is waiting downstream, so the pipeline always moves
and the store holds at most the budget plus one task's output per stage.

THREADS: ``Execution`` is created and consumed on the caller's thread; its stages run on the
executor thread; the two meet under ``_cv``.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator, List, Optional

import torus
from torus.data._internal import progress
from torus.data._internal.plan import AllToAll, Limit, MapSpec, Plan, Read
from torus.data._internal.stages import BarrierStage, Bundle, LimitStage, Stage, TaskStage


def _cluster_cpus() -> float:
    try:
        return max(1.0, torus.cluster_resources().get("CPU", 1.0))
    except Exception:
        return 1.0


def _budget(ctx) -> int:
    lim = ctx.execution_options.resource_limits.object_store_memory
    if lim:
        return int(lim)
    try:
        cap = torus.cluster_resources().get("object_store_memory", 0)
    except Exception:
        cap = 0
    return int((cap or (2 << 30)) * ctx.object_store_memory_fraction)


def _map_name(spec: MapSpec) -> str:
    return spec.name


def build_stages(plan: Plan, ctx) -> tuple:
    """(first stage's inputs, stages) for the plan."""
    from torus.data._internal.actor_pool import PoolStage
    cpus = _cluster_cpus()
    cap = ctx.max_tasks_in_flight_per_operator or max(2, int(cpus * 2))
    retries = ctx.max_task_retries
    stages: List[Stage] = []
    src = plan.source
    if isinstance(src, Read):
        first_inputs = list(src.tasks)
        limit = min(cap, src.concurrency) if src.concurrency else cap
        stages.append(TaskStage(src.name, [], src.ray_remote_args, limit,
                                ctx.target_max_block_size, retries, ctx))
    else:
        first_inputs = [Bundle(r, m) for r, m in zip(src.refs, src.metas)]
    for op in plan.ops:
        if isinstance(op, MapSpec) and op.pool is None:
            last = stages[-1] if stages else None
            # A map_batches with an explicit batch_size starts its own stage: its tasks combine
            # the blocks before it into whole batches (fused, it would see one task's rows).
            explicit = op.kind == "map_batches" and isinstance(op.batch_size, int)
            fusable = (isinstance(last, TaskStage) and not op.ray_remote_args and not explicit
                       and not last.opts_custom() and op.concurrency is None)
            if fusable:
                last.chain = last.chain + [op]
                last.name = f"{last.name}->{_map_name(op)}"
            else:
                limit = min(cap, op.concurrency) if op.concurrency else cap
                st = TaskStage(_map_name(op), [op], op.ray_remote_args, limit,
                               ctx.target_max_block_size, retries, ctx)
                stages.append(st)
        elif isinstance(op, MapSpec):
            last = stages[-1] if stages else None
            if (len(stages) == 1 and isinstance(last, TaskStage) and isinstance(src, Read)
                    and not last.opts_custom()):
                # The pool reads too (Ray's fusion of a read into the actor pool after it).
                stages[0] = PoolStage(op, ctx, last.chain, f"{last.name}->{_map_name(op)}")
            else:
                stages.append(PoolStage(op, ctx))
        elif isinstance(op, Limit):
            stages.append(LimitStage(op.n))
        elif isinstance(op, AllToAll):
            stages.append(BarrierStage(op, ctx))
        else:
            raise TypeError(f"unknown operator {op!r}")
    if not stages:  # input blocks consumed as they are
        stages.append(LimitStage(1 << 62))
        stages[-1].name = src.name
    return first_inputs, stages


class Execution:
    """One run of a plan. Iterate ``bundles()`` for the output; ``close()`` stops early."""

    def __init__(self, plan: Plan, ctx, *, show_progress: Optional[bool] = None):
        self.ctx = ctx
        inputs, self.stages = build_stages(plan, ctx)
        self.stages[0].inputs.extend(inputs)
        self.stages[0].inputs_done = True
        self.budget = _budget(ctx)
        self.held_bytes = 0           # given to the consumer and not yet released
        self.peak_bytes = 0
        self._cv = threading.Condition()
        self._out: List[Bundle] = []
        self._done = False
        self._error: Optional[BaseException] = None
        self._closed = False
        show = ctx.enable_progress_bars if show_progress is None else show_progress
        self.progress = progress.Bars(self.stages, enabled=show)
        self.t0 = time.perf_counter()
        self.wall_s = 0.0
        self._thread = threading.Thread(target=self._run, name="torus-data-executor", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- consumer side
    def bundles(self) -> Iterator[Bundle]:
        while True:
            with self._cv:
                while not self._out and not self._done and self._error is None:
                    self._cv.wait(0.5)
                if self._error is not None and not self._out:
                    raise self._error
                if not self._out:
                    return
                b = self._out.pop(0)
                self.held_bytes += b.meta.size_bytes
                self._cv.notify_all()
            try:
                yield b
            finally:
                self.release(b)

    def release(self, b: Bundle) -> None:
        with self._cv:
            self.held_bytes -= b.meta.size_bytes
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._out.clear()
            self._cv.notify_all()

    # ----------------------------------------------------------------- executor thread
    def _used(self) -> int:
        queued = sum(b.meta.size_bytes for s in self.stages for b in s.outputs)
        queued += sum(b.meta.size_bytes for s in self.stages[1:] for b in s.inputs
                      if isinstance(b, Bundle))
        with self._cv:
            queued += sum(b.meta.size_bytes for b in self._out) + self.held_bytes
        return queued + sum(s.running_bytes() for s in self.stages)

    def _waiting_downstream(self, i: int) -> bool:
        if self.stages[i].outputs:
            return True
        if i + 1 < len(self.stages):
            return bool(self.stages[i + 1].inputs)
        with self._cv:
            return bool(self._out) or self.held_bytes > 0

    def _cpu_room(self, s: Stage) -> bool:
        """Whether one more unit of `s` fits resource_limits.cpu (always, with no limit or
        nothing running)."""
        limit = self.ctx.execution_options.resource_limits.cpu
        if limit is None:
            return True
        used = sum(st.running() * st.cpus_per_unit() for st in self.stages)
        return used == 0 or used + s.cpus_per_unit() <= limit

    def _launch(self) -> bool:
        launched = False
        for i in reversed(range(len(self.stages))):
            s = self.stages[i]
            while s.can_launch():
                if isinstance(s, (BarrierStage, LimitStage)):
                    s.launch()
                    launched = True
                    continue
                if not self._cpu_room(s):
                    break
                used = self._used()
                fits = used + s.next_cost() <= self.budget
                if not fits and (s.running() or self._waiting_downstream(i)):
                    break
                s.launch()
                launched = True
                self.peak_bytes = max(self.peak_bytes, self._used())
        return launched

    def _move(self) -> None:
        for i, s in enumerate(self.stages):
            if i + 1 < len(self.stages):
                nxt = self.stages[i + 1]
                while s.outputs:
                    nxt.inputs.append(s.outputs.popleft())
                if s.finished and not s.outputs:
                    nxt.inputs_done = True
            else:
                with self._cv:
                    while s.outputs:
                        self._out.append(s.outputs.popleft())
                    self._cv.notify_all()
        # A finished limit stops everything before it.
        for i, s in enumerate(self.stages):
            if isinstance(s, LimitStage) and s.finished:
                for up in self.stages[:i]:
                    up.inputs.clear()
                    up.inputs_done = True

    def _all_done(self) -> bool:
        last = self.stages[-1]
        return all(s.finished or (s.inputs_done and not s.inputs and not s.running())
                   for s in self.stages) and not last.outputs

    def _step(self) -> None:
        self._move()
        for s in self.stages:
            s.on_ready(set())
        self._move()
        if self._launch():
            self._move()
        waits = [r for s in self.stages for r in s.waitables()]
        if waits:
            ready, _ = torus.wait(waits, num_returns=1, timeout=0.2, fetch_local=False)
            if ready:
                more, _ = torus.wait(waits, num_returns=len(waits), timeout=0, fetch_local=False)
                ready_set = set(ready) | set(more)
                for s in self.stages:
                    s.on_ready(ready_set)
        else:
            with self._cv:
                if not self._closed and not self._all_done():
                    self._cv.wait(0.05)
        self.progress.update()

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    if self._closed:
                        break
                if self._all_done():
                    self._move()
                    break
                self._step()
        except BaseException as e:  # surfaces in the consumer
            with self._cv:
                self._error = e
        finally:
            self.wall_s = time.perf_counter() - self.t0
            for s in self.stages:
                try:
                    s.shutdown()
                except Exception:
                    pass
            self.progress.close(self.wall_s)
            with self._cv:
                self._done = True
                self._cv.notify_all()
