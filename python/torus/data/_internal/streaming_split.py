"""streaming_split(n): n iterators over one streaming execution, for n concurrent consumers
(Ray Train's workers: one per host of a slice).

A coordinator actor (threaded, no CPU) runs the dataset's execution and hands its blocks out:
with ``equal=False`` each block goes whole to whichever consumer asks next (the faster one
takes more); with ``equal=True`` every block's rows are divided among all n consumers so that
each gets exactly the same number of rows per epoch (the < n rows that cannot be divided are
dropped, as Ray does). Consumers receive block refs with row ranges and slice them after a
zero-copy get. Each pass over an iterator is one epoch; epoch e+1's execution starts when a
consumer asks for it after every consumer has finished epoch e.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, List, Optional

import torus
from torus.data import block as B


class Piece:
    """A block or a row range of one, as a consumer receives it."""
    __slots__ = ("ref", "meta", "span")

    def __init__(self, ref, meta: B.BlockMetadata, span=None):
        self.ref, self.meta, self.span = ref, meta, span


@torus.remote(num_cpus=0)
class _SplitCoordinator:
    def __init__(self, plan, ctx, n: int, equal: bool):
        self.plan, self.ctx, self.n, self.equal = plan, ctx, n, equal
        self.cv = threading.Condition()
        self.epoch = -1
        self.finished: set = set()          # consumers done with the current epoch
        self.queues: List[Deque[Piece]] = [collections.deque() for _ in range(n)]
        self.source = None                   # the current execution's bundle iterator
        self.exhausted = True
        self.pulling = False
        self.carry: List[Piece] = []         # equal: rows not yet divided
        self.error: Optional[BaseException] = None

    def _start_epoch(self, epoch: int) -> None:
        from torus.data._internal.executor import Execution
        self.epoch = epoch
        self.finished = set()
        self.queues = [collections.deque() for _ in range(self.n)]
        self.carry = []
        self.error = None
        self.source = Execution(self.plan, self.ctx, show_progress=False).bundles()
        self.exhausted = False

    def _divide(self, piece: Piece) -> None:
        if not self.equal:
            return
        self.carry.append(piece)
        rows = sum(p.span[1] - p.span[0] for p in self.carry)
        each = rows // self.n
        if each == 0:
            return
        flat = [(p, p.span[0], p.span[1]) for p in self.carry]
        self.carry = []
        for q in self.queues:
            need = each
            while need:
                p, a, b = flat[0]
                take = min(need, b - a)
                q.append(Piece(p.ref, p.meta, (a, a + take)))
                need -= take
                flat[0] = (p, a + take, b)
                if a + take == b:
                    flat.pop(0)
        self.carry = [Piece(p.ref, p.meta, (a, b)) for p, a, b in flat if b > a]

    def _pull_one(self, i: int) -> None:
        """Takes the next block from the execution (lock released while waiting on it)."""
        self.pulling = True
        self.cv.release()
        try:
            b = next(self.source, None)
        except BaseException as e:
            b, err = None, e
        else:
            err = None
        finally:
            self.cv.acquire()
            self.pulling = False
        if err is not None:
            self.error = err
        if b is None:
            self.exhausted = True
        elif self.equal:
            self._divide(Piece(b.ref, b.meta, (0, b.meta.num_rows)))
        else:
            self.queues[i].append(Piece(b.ref, b.meta, None))
        self.cv.notify_all()

    def next(self, i: int, epoch: int) -> Optional[Piece]:
        with self.cv:
            if epoch > self.epoch:
                while self.epoch >= 0 and len(self.finished) < self.n and epoch > self.epoch:
                    self.cv.wait(0.5)
                if epoch > self.epoch:
                    self._start_epoch(epoch)
            while True:
                if self.queues[i]:
                    return self.queues[i].popleft()
                if self.error is not None:
                    raise self.error
                if self.exhausted:
                    self.finished.add(i)
                    self.cv.notify_all()
                    return None
                if self.pulling:
                    self.cv.wait(0.5)
                else:
                    self._pull_one(i)


class _ShardSource:
    """The bundles of shard i, one epoch per call (picklable: it travels to Train workers).

    Prefetches by keeping the next request to the coordinator in flight, and waits for it with
    ``torus.get`` on the consumer's own thread: a consumer task blocked there lends its CPU back
    to its node (a thread of its own waiting would not), so the coordinator's read and map tasks
    can run even when the consumers hold every CPU."""
    prefetches_itself = True

    def __init__(self, coordinator, i: int):
        self.coordinator, self.i, self.epoch = coordinator, i, -1

    def __call__(self):
        self.epoch += 1
        epoch = self.epoch
        ahead = self.coordinator.next.remote(self.i, epoch)
        while True:
            p = torus.get(ahead)
            if p is None:
                return
            ahead = self.coordinator.next.remote(self.i, epoch)
            yield p


def streaming_split(ds, n: int, *, equal: bool = False, locality_hints=None) -> List[Any]:
    from torus.data.context import DataContext
    from torus.data.iterator import DataIterator
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"streaming_split: n must be a positive int, got {n!r}")
    if locality_hints is not None and len(locality_hints) != n:
        raise ValueError(f"Locality hints list must have length {n}, got {len(locality_hints)}")
    torus._private.worker.ensure_initialized()
    coord = _SplitCoordinator.options(max_concurrency=n + 4).remote(
        ds._plan, DataContext.get_current().copy(), n, equal)
    return [DataIterator(_ShardSource(coord, i), name=f"SplitIterator({i}/{n})") for i in range(n)]
