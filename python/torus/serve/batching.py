"""`@serve.batch`: concurrent calls of a method (or function) are gathered into one call that
takes lists and returns a list, one result per call, in order.

A batch is sent when it holds `max_batch_size` calls or `batch_wait_timeout_s` passed since its
first call; at most `max_concurrent_batches` run at once. With one positional argument the
function gets a list of them; with several, one list per argument (keywords likewise). If it
raises, every call of the batch raises that error; a result list of the wrong length fails
every call with a ValueError naming both lengths.

Threading: a batch queue lives on the event loop of its first call (the replica's loop); a
sync batched function runs in a thread of the default executor. One queue per instance (for a
method) or per function.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Callable, List, Optional


class _BatchQueue:
    def __init__(self, fn: Callable, owner: Any, max_batch_size: int, timeout_s: float,
                 max_concurrent: int, batch_size_fn: Optional[Callable]):
        self.fn = fn
        self.owner = owner
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self.batch_size_fn = batch_size_fn
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sem = asyncio.Semaphore(max_concurrent)
        self.task = asyncio.ensure_future(self._loop())

    def _size(self, batch) -> int:
        if self.batch_size_fn is None:
            return len(batch)
        return self.batch_size_fn([b[0][0] if b[0] else None for b in batch])

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.timeout_s
            while self._size(batch) < self.max_batch_size:
                left = deadline - loop.time()
                try:
                    item = self.queue.get_nowait() if left <= 0 else \
                        await asyncio.wait_for(self.queue.get(), left)
                except (asyncio.TimeoutError, asyncio.QueueEmpty):
                    break
                batch.append(item)
            await self.sem.acquire()
            asyncio.ensure_future(self._run(batch))

    async def _run(self, batch) -> None:
        futs = [b[2] for b in batch]
        try:
            nargs = max(len(b[0]) for b in batch)
            args = [[b[0][i] if i < len(b[0]) else None for b in batch] for i in range(nargs)]
            keys = {k for b in batch for k in b[1]}
            kwargs = {k: [b[1].get(k) for b in batch] for k in keys}
            call_args = ([self.owner] if self.owner is not None else []) + args
            if inspect.iscoroutinefunction(self.fn):
                results = await self.fn(*call_args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                results = await loop.run_in_executor(
                    None, functools.partial(self.fn, *call_args, **kwargs))
            results = list(results)
            if len(results) != len(batch):
                raise ValueError(f"Batched function doesn't preserve batch size. The input "
                                 f"list has length {len(batch)} but the returned list has "
                                 f"length {len(results)}.")
            for f, r in zip(futs, results):
                if not f.done():
                    f.set_result(r)
        except BaseException as e:
            for f in futs:
                if not f.done():
                    f.set_exception(e)
        finally:
            self.sem.release()


def batch(_func: Optional[Callable] = None, /, max_batch_size: int = 10,
          batch_wait_timeout_s: float = 0.01, max_concurrent_batches: int = 1,
          batch_size_fn: Optional[Callable[[List], int]] = None):
    if _func is not None and not callable(_func):
        raise TypeError("@serve.batch can only be used to decorate functions or methods.")
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or \
            max_batch_size < 1:
        raise ValueError("max_batch_size must be an integer >= 1")
    if not isinstance(batch_wait_timeout_s, (int, float)) or batch_wait_timeout_s < 0:
        raise ValueError("batch_wait_timeout_s must be a float >= 0")
    if not isinstance(max_concurrent_batches, int) or max_concurrent_batches < 1:
        raise ValueError("max_concurrent_batches must be an integer >= 1")

    def decorate(fn):
        params = list(inspect.signature(fn).parameters)
        is_method = bool(params) and params[0] == "self"
        settings = {"max_batch_size": max_batch_size, "timeout": batch_wait_timeout_s}
        attr = f"__serve_batch_queue_{fn.__name__}_{id(fn)}"
        fn_queues = {}

        def queue_for(owner) -> _BatchQueue:
            loop = asyncio.get_running_loop()
            holder = owner.__dict__ if owner is not None else fn_queues
            q = holder.get(attr)
            if q is None or q.task.get_loop() is not loop:
                q = holder[attr] = _BatchQueue(fn, owner, settings["max_batch_size"],
                                               settings["timeout"], max_concurrent_batches,
                                               batch_size_fn)
            q.max_batch_size, q.timeout_s = settings["max_batch_size"], settings["timeout"]
            return q

        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            owner = None
            if is_method:
                owner, args = args[0], args[1:]
            fut = asyncio.get_running_loop().create_future()
            queue_for(owner).queue.put_nowait((args, kwargs, fut))
            return await fut

        def set_max_batch_size(n: int) -> None:
            settings["max_batch_size"] = n

        def set_batch_wait_timeout_s(t: float) -> None:
            settings["timeout"] = t

        wrapper.set_max_batch_size = set_max_batch_size
        wrapper.set_batch_wait_timeout_s = set_batch_wait_timeout_s
        wrapper._get_max_batch_size = lambda: settings["max_batch_size"]
        wrapper._get_batch_wait_timeout_s = lambda: settings["timeout"]
        return wrapper

    return decorate(_func) if _func is not None else decorate
