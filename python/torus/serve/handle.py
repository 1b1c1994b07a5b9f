"""`DeploymentHandle`, `DeploymentResponse` and `DeploymentResponseGenerator` (Ray 2.60's API).

`handle.remote(...)` returns at once: the request goes to a replica now or waits in the
deployment's router (`_private/router.py`). A response is read with `.result(timeout_s)` from
sync code or `await response` from async code; passed as an argument to another handle call it
travels as an object reference, so the value goes from one replica to the next without passing
through the caller. `handle.options(stream=True)` calls a generator method; its
`DeploymentResponseGenerator` yields the items as the replica makes them (sync or async
iteration), fetched in batches of what is ready.

Handles pickle to their deployment's name and options and work in any process of the cluster.
Responses are not thread-safe for concurrent readers (as in Ray); everything else is.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Callable, List, Optional

from torus.serve._private import router as _router


class _Options:
    __slots__ = ("method_name", "stream", "multiplexed_model_id")

    def __init__(self, method_name="__call__", stream=False, multiplexed_model_id=""):
        self.method_name = method_name
        self.stream = stream
        self.multiplexed_model_id = multiplexed_model_id


class DeploymentHandle:
    """Calls a deployment's replicas: `handle.remote(*args)`, `handle.method.remote(*args)`."""

    def __init__(self, deployment_name: str, app_name: str = "default", *,
                 _options: Optional[_Options] = None):
        self.deployment_name = deployment_name
        self.app_name = app_name
        self._opts = _options or _Options()

    @property
    def deployment_id(self):
        from torus.serve.context import DeploymentID
        return DeploymentID(self.deployment_name, self.app_name)

    def options(self, *, method_name: Optional[str] = None, stream: Optional[bool] = None,
                multiplexed_model_id: Optional[str] = None, use_new_handle_api=None,
                _prefer_local_routing=None, **_ignored) -> "DeploymentHandle":
        o = self._opts
        return DeploymentHandle(self.deployment_name, self.app_name, _options=_Options(
            o.method_name if method_name is None else method_name,
            o.stream if stream is None else bool(stream),
            o.multiplexed_model_id if multiplexed_model_id is None else multiplexed_model_id))

    def __getattr__(self, name: str) -> "DeploymentHandle":
        if name.startswith("_"):
            raise AttributeError(name)
        return self.options(method_name=name)

    def remote(self, *args, **kwargs):
        router = _router.get_router(self.app_name, self.deployment_name)
        meta = {"method": self._opts.method_name}
        if self._opts.multiplexed_model_id:
            meta["multiplexed_model_id"] = self._opts.multiplexed_model_id
        if self._opts.stream:
            resp = DeploymentResponseGenerator(router)
            method = "handle_request_streaming"
        else:
            resp = DeploymentResponse(router)
            method = "handle_request"
        req = _router.Request(method, meta, args, kwargs, resp)
        req.deps = [a for a in list(args) + list(kwargs.values())
                    if isinstance(a, DeploymentResponse) and not a._assigned()]
        router.submit(req)
        return resp

    def __reduce__(self):
        o = self._opts
        return (_rebuild_handle, (self.deployment_name, self.app_name, o.method_name, o.stream,
                                  o.multiplexed_model_id))

    def __repr__(self):
        return (f"DeploymentHandle(deployment='{self.deployment_name}', "
                f"app='{self.app_name}')")


def _rebuild_handle(dep, app, method, stream, model):
    return DeploymentHandle(dep, app, _options=_Options(method, stream, model))


class _ResponseBase:
    """What a request's caller holds: assignment to a replica (or the error that prevented it),
    then the call's object reference."""

    def __init__(self, router):
        self._router = router
        self._ref = None
        self._req = None
        self._actor = None
        self._replica_id = ""
        self._error: Optional[BaseException] = None
        self._event = threading.Event()
        self._callbacks: List[Callable[[], None]] = []
        self._cb_lock = threading.Lock()
        self._released = False

    # called by the router
    def _assign(self, ref, req) -> None:
        self._ref = ref
        self._req = req
        self._actor = req.replica.actor  # the replica, for later calls (streams)
        self._replica_id = req.replica.replica_id
        self._settle()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._settle()

    def _settle(self) -> None:
        with self._cb_lock:
            self._event.set()
            cbs, self._callbacks = self._callbacks, []
        for cb in cbs:
            cb()

    def _assigned(self) -> bool:
        return self._event.is_set()

    def _on_assigned(self, cb: Callable[[], None]) -> None:
        with self._cb_lock:
            if not self._event.is_set():
                self._callbacks.append(cb)
                return
        cb()

    def _wait_assigned(self, timeout_s: Optional[float]) -> None:
        if not self._event.wait(timeout_s):
            raise TimeoutError("Timed out waiting for a replica to take the request.")
        if self._error is not None:
            raise self._error

    async def _wait_assigned_async(self) -> None:
        if not self._event.is_set():
            loop = asyncio.get_running_loop()
            fut = loop.create_future()

            def done():
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))
            self._on_assigned(done)
            await fut
        if self._error is not None:
            raise self._error

    def _release(self) -> None:
        if not self._released and self._req is not None:
            self._released = True
            self._router.release(self._req)

    def _resubmit(self, e: BaseException) -> bool:
        """A call the core never sent (its replica was already known dead: the core says "is
        dead", not "died while running") goes to another replica; True if it was resent."""
        from torus.exceptions import ActorDiedError
        if not isinstance(e, ActorDiedError) or self._req is None:
            return False
        if " is dead: " not in str(getattr(e, "_cause", "") or ""):
            return False
        req = self._req
        self._router.replica_died(self._replica_id, str(e))
        self._ref = self._req = self._actor = None
        self._replica_id = ""
        self._event = threading.Event()
        self._router.resend(req)
        return True

    def _replica_error(self, e: BaseException) -> None:
        from torus.exceptions import ActorDiedError, ActorUnavailableError
        if isinstance(e, (ActorDiedError, ActorUnavailableError)) and self._replica_id:
            self._router.replica_died(self._replica_id, str(e))

    def cancel(self) -> None:
        import torus
        if self._ref is not None:
            try:
                torus.cancel(self._ref)
            except Exception:
                pass


class DeploymentResponse(_ResponseBase):
    """The future result of one handle call."""

    def result(self, *, timeout_s: Optional[float] = None, _skip_asyncio_check: bool = False):
        import torus
        from torus.exceptions import GetTimeoutError
        start = time.monotonic()
        for attempt in range(4):
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
            self._wait_assigned(left)
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
            try:
                value = torus.get(self._ref, timeout=left)
            except GetTimeoutError as e:
                raise TimeoutError(str(e)) from None  # the call runs on: keep its slot
            except Exception as e:
                if attempt < 3 and self._resubmit(e):
                    continue
                self._replica_error(e)
                self._release()
                raise
            self._release()
            return value

    def __await__(self):
        return self._await().__await__()

    async def _await(self):
        for attempt in range(4):
            await self._wait_assigned_async()
            try:
                value = await _await_ref(self._ref)
            except Exception as e:
                if attempt < 3 and self._resubmit(e):
                    continue
                self._replica_error(e)
                self._release()
                raise
            except BaseException:
                self._release()
                raise
            self._release()
            return value

    def _ref_now(self):
        """The object reference of an assigned call (the router only asks once assigned)."""
        if self._error is not None:
            raise self._error
        return self._ref

    async def _to_object_ref(self, _record_telemetry: bool = True):
        await self._wait_assigned_async()
        return self._ref

    def _to_object_ref_sync(self, _record_telemetry: bool = True, _allow_running_in_asyncio_loop=False):
        self._wait_assigned(None)
        return self._ref


class StopStream(Exception):
    pass


class DeploymentResponseGenerator(_ResponseBase):
    """The items of a streaming handle call, as the replica makes them."""

    def __init__(self, router):
        super().__init__(router)
        self._buffer: List[Any] = []
        self._stream_id = None
        self._finished = False
        self._next_ref = None

    def _take_batch(self, batch) -> None:
        self._stream_id = batch["stream_id"]
        self._buffer.extend(batch["items"])
        if batch["done"]:
            self._finished = True
            self._release()

    def __iter__(self):
        return self

    def __next__(self):
        import torus
        while not self._buffer:
            if self._finished:
                raise StopIteration
            if self._stream_id is None:
                self._wait_assigned(None)
                ref = self._ref
            else:
                ref = self._actor.stream_next.remote(self._stream_id)
            try:
                self._take_batch(torus.get(ref))
            except Exception as e:
                self._finished = True
                self._replica_error(e)
                self._release()
                raise
        return self._buffer.pop(0)

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._buffer:
            if self._finished:
                raise StopAsyncIteration
            if self._stream_id is None:
                await self._wait_assigned_async()
                ref = self._ref
            else:
                ref = self._actor.stream_next.remote(self._stream_id)
            try:
                self._take_batch(await _await_ref(ref))
            except Exception as e:
                self._finished = True
                self._replica_error(e)
                self._release()
                raise
        return self._buffer.pop(0)

    def cancel(self) -> None:
        if self._stream_id is not None and not self._finished and self._req is not None:
            try:
                self._actor.stream_cancel.remote(self._stream_id)
            except Exception:
                pass
        self._finished = True
        self._release()


# --- awaiting object references from an event loop ---------------------------------------
_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _await_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=256, thread_name_prefix="serve-await")
    return _pool


def _await_ref(ref):
    """Awaits `ref` on the running loop (a pool thread waits for it; Serve's own pool, so
    long waits here cannot starve the user's `await ref`)."""
    import torus
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(_await_pool(), torus.get, ref)
