"""ActorPool (Ray's `ray.util.ActorPool`): spread work over a fixed set of actors."""
from __future__ import annotations

from typing import Any, Callable, List

import torus


class ActorPool:
    def __init__(self, actors: List[Any]):
        self._idle_actors = list(actors)
        self._future_to_actor = {}
        self._index_to_future = {}
        self._next_task_index = 0
        self._next_return_index = 0
        self._pending_submits = []

    def map(self, fn: Callable, values):
        return self._map(fn, values, self.get_next)

    def map_unordered(self, fn: Callable, values):
        return self._map(fn, values, self.get_next_unordered)

    def _map(self, fn: Callable, values, next_result):
        # As Ray: results still pending from earlier submits are drained first.
        while self.has_next():
            self.get_next_unordered()
        for v in values:
            self.submit(fn, v)

        def get_generator():
            while self.has_next():
                yield next_result()
        return get_generator()

    def submit(self, fn, value):
        if self._idle_actors:
            actor = self._idle_actors.pop()
            future = fn(actor, value)
            self._future_to_actor[future] = (self._next_task_index, actor)
            self._index_to_future[self._next_task_index] = future
            self._next_task_index += 1
        else:
            self._pending_submits.append((fn, value))

    def has_next(self) -> bool:
        return bool(self._future_to_actor)

    def get_next(self, timeout=None, ignore_if_timedout=False):
        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("It is not allowed to call get_next() after "
                             "get_next_unordered().")
        future = self._index_to_future[self._next_return_index]
        if timeout is not None:
            ready, _ = torus.wait([future], timeout=timeout)
            if not ready:
                raise TimeoutError("Timed out waiting for result")
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        _, a = self._future_to_actor.pop(future)
        self._return_actor(a)
        return torus.get(future)

    def get_next_unordered(self, timeout=None, ignore_if_timedout=False):
        if not self.has_next():
            raise StopIteration("No more results to get")
        ready, _ = torus.wait(list(self._future_to_actor), num_returns=1, timeout=timeout)
        if not ready:
            raise TimeoutError("Timed out waiting for result")
        future = ready[0]
        i, a = self._future_to_actor.pop(future)
        self._return_actor(a)
        del self._index_to_future[i]
        self._next_return_index = max(self._next_return_index, i + 1)
        return torus.get(future)

    def _return_actor(self, actor):
        self._idle_actors.append(actor)
        if self._pending_submits:
            self.submit(*self._pending_submits.pop(0))

    def has_free(self) -> bool:
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self):
        return self._idle_actors.pop() if self.has_free() else None

    def push(self, actor):
        self._return_actor(actor)
