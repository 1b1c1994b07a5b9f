"""A Serve replica: the actor that holds one instance of the user's class (or function) and
runs its requests.

Calls, all made by routers and the controller:
- `initialize(user_config)`: builds the user object (its constructor runs in a thread, so health
  checks are answered while a model loads), applies `user_config`, returns where it runs.
- `handle_request(meta, *args, **kwargs)`: one handle call; `meta["method"]` names the method.
  Arguments that were object references arrive resolved by the core.
- `handle_request_streaming(...)` / `stream_next(id)` / `stream_cancel(id)`: a generator
  method's items, in batches of what is ready (at least one item, or the end).
- `handle_http(meta, scope, body)`: one HTTP request through a starlette `Request` (or the
  `serve.ingress` ASGI app); returns the status, headers and body, or the first part and a
  stream id when the response streams (read on with `stream_next`).
- `check_health()`, `reconfigure(user_config)`, `stats()`, `prepare_for_shutdown()`.

A replica on a multi-host slice is a gang of these actors, one per host (rank = bundle index),
all holding the user's class: rank 0 takes the requests and runs each user call on every rank
with the same arguments (SPMD: the ranks' jitted steps and collectives meet), one call at a time
so every rank runs them in the same order; rank 0's answer is the replica's. Before the user's
constructor runs, each rank gets the JAX coordination environment (`JAX_COORDINATOR_ADDRESS`,
`TORUS_COORDINATOR_ADDRESS`, `TORUS_NUM_PROCESSES`, `TORUS_PROCESS_ID`), as JaxTrainer's workers do.

Threading: an async actor. Everything above runs on the actor's event loop; the user's sync
methods (and constructor) run in a thread pool of `max_ongoing_requests` threads, as Ray 2.60
does (RAY_SERVE_RUN_SYNC_IN_THREADPOOL=1), with the request's context copied in.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import os
import threading
import time
import traceback
import uuid
from typing import Any, Dict, List, Optional

from torus.serve import context as _ctx
from torus.serve._private import http_util
from torus.serve._private import metrics as _metrics

logger = logging.getLogger("torus.serve")

_STREAM_BATCH = 256  # items per stream_next answer at most


class _Stream:
    """Items made by a running task, read in batches by the caller."""

    def __init__(self):
        self.items: List[Any] = []
        self.done = False
        self.error: Optional[BaseException] = None
        self.event = asyncio.Event()
        self.task: Optional[asyncio.Task] = None
        self.last_read = time.monotonic()

    def put(self, item) -> None:
        self.items.append(item)
        self.event.set()

    def finish(self, error: Optional[BaseException] = None) -> None:
        self.done = True
        self.error = error
        self.event.set()

    async def next_batch(self) -> List[Any]:
        self.last_read = time.monotonic()
        while not self.items and not self.done:
            self.event.clear()
            await self.event.wait()
        out, self.items = self.items[:_STREAM_BATCH], self.items[_STREAM_BATCH:]
        if not out and self.error is not None:
            raise self.error
        return out


def _import_starlette() -> None:
    import importlib
    try:
        for m in ("starlette.requests", "starlette.responses"):
            importlib.import_module(m)
    except ImportError:
        pass


class ServeReplica:
    def __init__(self, app_name: str, deployment_name: str, replica_id: str, payload: bytes,
                 config: Dict[str, Any], rank: int = 0, world_size: int = 1):
        self._app = app_name
        self._deployment = deployment_name
        self._replica_id = replica_id
        self._payload = payload
        self._config = config
        self._user = None
        self._is_function = False
        self._asgi_app = None
        self._ongoing = 0
        self._total = 0
        self._streams: Dict[str, _Stream] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, int(config.get("max_ongoing_requests", 5))),
            thread_name_prefix="serve-replica")
        self._rank = rank
        self._world_size = world_size
        self._shutting_down = False
        self._health_error: Optional[str] = None
        self._peers: List[Any] = []  # rank 0 of a gang: the other ranks' actors
        self._gang_lock: Optional[asyncio.Lock] = None

    async def where(self) -> Dict[str, Any]:
        """This rank's host and a free port there (rank 0's is the JAX coordinator's)."""
        import socket
        from torus.runtime_context import get_runtime_context
        from torus.util import get_node_ip_address
        ip = get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        return {"ip": ip, "port": port, "node_id": get_runtime_context().get_node_id(),
                "pid": os.getpid()}

    # --- life ---------------------------------------------------------------------------------
    async def initialize(self, user_config, gang: Optional[Dict[str, Any]] = None
                         ) -> Dict[str, Any]:
        import cloudpickle
        from torus._private import shim
        shim.install()  # the user's code is a Ray program, whoever started Serve
        if gang is not None:
            os.environ["JAX_COORDINATOR_ADDRESS"] = gang["coordinator"]
            os.environ["TORUS_COORDINATOR_ADDRESS"] = gang["coordinator"]
            os.environ["TORUS_NUM_PROCESSES"] = str(self._world_size)
            os.environ["TORUS_PROCESS_ID"] = str(self._rank)
            os.environ["JAX_NUM_PROCESSES"] = str(self._world_size)
            os.environ["JAX_PROCESS_ID"] = str(self._rank)
            if self._rank == 0:
                self._peers = list(gang["peers"])
                self._gang_lock = asyncio.Lock()
        from torus.runtime_context import get_runtime_context
        target, args, kwargs = cloudpickle.loads(self._payload)
        self._payload = b""
        rid = _ctx.ReplicaID(self._replica_id,
                             _ctx.DeploymentID(self._deployment, self._app))
        replica_ctx = _ctx.ReplicaContext(rid, None, self._rank, self._world_size)
        _ctx._set_replica_context(replica_ctx)
        loop = asyncio.get_running_loop()
        if inspect.isclass(target):
            self._asgi_app = getattr(target, "_serve_asgi_app", None)
            self._user = await loop.run_in_executor(
                self._pool, contextvars.copy_context().run, lambda: target(*args, **kwargs))
        else:
            self._is_function = True
            self._user = target
        replica_ctx.servable_object = self._user
        if self._asgi_app is not None:
            self._asgi_app = _bind_asgi(self._asgi_app, self._user)
        if user_config is not None:
            await self._reconfigure(user_config)
        if self._asgi_app is None:
            # An HTTP request reaches __call__ as a starlette Request; importing starlette takes
            # ~40 ms, which the first request would otherwise wait for. Done beside the rest of
            # the start (the proxy's, the controller's round), not in the user's constructor.
            threading.Thread(target=_import_starlette, name="serve-import", daemon=True).start()
        ctx = get_runtime_context()
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(),
                "actor_id": ctx.get_actor_id() if hasattr(ctx, "get_actor_id") else ""}

    async def reconfigure(self, user_config) -> None:
        if self._peers:
            return await self._on_all("reconfigure", lambda: self._reconfigure(user_config),
                                      user_config)
        return await self._reconfigure(user_config)

    async def _reconfigure(self, user_config) -> None:
        fn = getattr(self._user, "reconfigure", None) if not self._is_function else None
        if fn is None:
            if user_config is not None:
                raise ValueError("user_config is set but the deployment has no "
                                 "`reconfigure` method")
            return
        await self._call_user(fn, (user_config,), {})

    async def check_health(self) -> bool:
        if self._user is None or self._is_function:
            return True
        fn = getattr(self._user, "check_health", None)
        if fn is not None:
            await self._call_user(fn, (), {})
        return True

    async def stats(self) -> Dict[str, Any]:
        now = time.monotonic()
        for sid, s in list(self._streams.items()):  # streams their readers abandoned
            if s.done and now - s.last_read > 60 or now - s.last_read > 600:
                self._drop_stream(sid)
        models = getattr(self._user, "_serve_loaded_models", None) if self._user else None
        _metrics.REGISTRY.set("ray_serve_replica_processing_queries",
                              {"deployment": self._deployment, "replica": self._replica_id,
                               "application": self._app}, self._ongoing)
        return {"ongoing": self._ongoing, "total": self._total,
                "models": list(models() if callable(models) else []),
                "metrics": _metrics.REGISTRY.snapshot()}

    async def prepare_for_shutdown(self) -> bool:
        """Waits (graceful_shutdown_timeout_s at most) for running requests to end, then runs
        the user's `__del__`."""
        self._shutting_down = True
        wait_loop = max(0.0, float(self._config.get("graceful_shutdown_wait_loop_s", 2.0)))
        deadline = time.monotonic() + self._config.get("graceful_shutdown_timeout_s", 20.0)
        # As Ray: wait one loop first, however idle the replica looks. The controller has just
        # told the routers to stop sending here, and a request a router picked this replica for
        # before it heard may still be on its way; an idle moment is not the end of the work.
        await asyncio.sleep(max(0.0, min(wait_loop, deadline - time.monotonic())))
        while (self._ongoing > 0 or any(not s.done for s in self._streams.values())) and \
                time.monotonic() < deadline:
            await asyncio.sleep(min(wait_loop, 0.05) if wait_loop > 0 else 0.05)
        d = getattr(type(self._user), "__del__", None) if self._user is not None and \
            not self._is_function else None
        if d is not None:
            try:
                await self._call_user(d, (self._user,), {})
            except Exception:
                logger.exception("serve: __del__ of the replica raised")
        return True

    # --- requests -----------------------------------------------------------------------------
    def _method(self, name: str):
        if self._is_function:
            if name != "__call__":
                raise AttributeError(f"function deployment '{self._deployment}' has only "
                                     f"__call__, not {name!r}")
            return self._user
        try:
            return getattr(self._user, name)
        except AttributeError:
            raise AttributeError(f"Deployment '{self._deployment}' has no method "
                                 f"'{name}'") from None

    async def _call_user(self, fn, args, kwargs):
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            r = fn(*args, **kwargs)
        else:
            ctx = contextvars.copy_context()
            r = await asyncio.get_running_loop().run_in_executor(
                self._pool, lambda: ctx.run(fn, *args, **kwargs))
        if inspect.isawaitable(r):
            r = await r
        return r

    def _enter(self, meta: Dict[str, Any]):
        """A request starts: counted, and its context set (returns what `_leave` takes)."""
        self._ongoing += 1
        self._total += 1
        token = _ctx._request_context.set(_ctx.RequestContext(
            route=meta.get("route", ""), request_id=meta.get("request_id") or uuid.uuid4().hex,
            app_name=self._app, multiplexed_model_id=meta.get("multiplexed_model_id", "")))
        return token, time.monotonic(), meta.get("route") or meta.get("method", "")

    def _leave(self, entered, error: bool = False, reset: bool = True) -> None:
        token, t0, route = entered
        self._ongoing -= 1
        if reset:
            _ctx._request_context.reset(token)
        labels = {"deployment": self._deployment, "replica": self._replica_id,
                  "route": route, "application": self._app}
        _metrics.REGISTRY.inc("ray_serve_deployment_request_counter_total", labels)
        if error:
            _metrics.REGISTRY.inc("ray_serve_deployment_error_counter_total", labels)
        _metrics.REGISTRY.observe("ray_serve_deployment_processing_latency_ms", labels,
                                  (time.monotonic() - t0) * 1000)

    # --- a gang's rank 0 runs each user call on every rank ------------------------------------
    async def _on_all(self, method: str, local, *args, **kwargs):
        """Runs `method(*args)` on the other ranks and `local()` here, one call at a time;
        returns the local result, or raises the first error of any rank."""
        from torus.serve.handle import _await_ref
        async with self._gang_lock:
            refs = [getattr(p, method).remote(*args, **kwargs) for p in self._peers]
            results = await asyncio.gather(local(), *(_await_ref(r) for r in refs),
                                           return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            return results[0]

    async def _on_all_streaming(self, method: str, local, *args, **kwargs):
        """`_on_all` for calls whose answer may stream (a first batch and a stream id): every
        rank at once, rank 0's first answer returned; the gang stays locked until rank 0's
        stream and the other ranks' streams (read and dropped) have ended."""
        from torus.serve.handle import _await_ref
        await self._gang_lock.acquire()
        try:
            answer, *firsts = await asyncio.gather(
                local(), *(_await_ref(getattr(p, method).remote(*args, **kwargs))
                           for p in self._peers))
        except BaseException:
            self._gang_lock.release()
            raise
        stream = None if answer.get("done") else self._streams.get(answer.get("stream_id"))
        drains = asyncio.ensure_future(self._drain_peer_streams(firsts))

        async def unlock():
            try:
                if stream is not None and stream.task is not None:
                    await asyncio.wait([stream.task])
                await drains
            except BaseException:
                pass
            finally:
                self._gang_lock.release()
        if stream is None:
            await unlock()
        else:
            asyncio.ensure_future(unlock())
        return answer

    async def _drain_peer_streams(self, first_batches) -> None:
        from torus.serve.handle import _await_ref
        for peer, batch in zip(self._peers, first_batches):
            while batch.get("stream_id") and not batch.get("done"):
                batch = await _await_ref(peer.stream_next.remote(batch["stream_id"]))

    async def handle_request(self, meta: Dict[str, Any], *args, **kwargs):
        if self._peers:
            return await self._on_all("handle_request",
                                      lambda: self._handle_request(meta, *args, **kwargs),
                                      meta, *args, **kwargs)
        return await self._handle_request(meta, *args, **kwargs)

    async def _handle_request(self, meta: Dict[str, Any], *args, **kwargs):
        token = self._enter(meta)
        error = True
        try:
            r = await self._call_user(self._method(meta["method"]), args, kwargs)
            error = False
            return r
        finally:
            self._leave(token, error)

    async def handle_request_streaming(self, meta: Dict[str, Any], *args, **kwargs):
        if self._peers:
            return await self._on_all_streaming(
                "handle_request_streaming",
                lambda: self._handle_request_streaming(meta, *args, **kwargs),
                meta, *args, **kwargs)
        return await self._handle_request_streaming(meta, *args, **kwargs)

    async def _handle_request_streaming(self, meta: Dict[str, Any], *args, **kwargs):
        token = self._enter(meta)
        stream = _Stream()
        sid = uuid.uuid4().hex
        try:
            fn = self._method(meta["method"])
            if inspect.isasyncgenfunction(fn):
                gen = fn(*args, **kwargs)
            else:
                gen = await self._call_user(fn, args, kwargs)
            if not (inspect.isasyncgen(gen) or inspect.isgenerator(gen)):
                raise TypeError(f"Method '{meta['method']}' returned a non-generator object "
                                f"({type(gen).__name__}) but the handle has stream=True.")
        except BaseException:
            self._leave(token, True)
            raise
        self._streams[sid] = stream
        stream.task = asyncio.ensure_future(self._pump(gen, stream, token))
        items = await stream.next_batch()
        return self._batch_answer(sid, stream, items)

    async def _pump(self, gen, stream: _Stream, token) -> None:
        error = False
        try:
            if inspect.isasyncgen(gen):
                async for item in gen:
                    stream.put(item)
            else:
                loop = asyncio.get_running_loop()
                end = object()
                while True:
                    item = await loop.run_in_executor(self._pool, next, gen, end)
                    if item is end:
                        break
                    stream.put(item)
            stream.finish()
        except asyncio.CancelledError:
            stream.finish()
        except BaseException as e:
            error = True
            stream.finish(e)
        finally:
            self._leave(token, error, reset=False)  # another task's context: nothing to reset

    def _batch_answer(self, sid: str, stream: _Stream, items: List[Any]) -> Dict[str, Any]:
        done = stream.done and not stream.items
        if done:
            self._drop_stream(sid)
        return {"stream_id": sid, "items": items, "done": done}

    async def stream_next(self, sid: str) -> Dict[str, Any]:
        stream = self._streams.get(sid)
        if stream is None:
            return {"stream_id": sid, "items": [], "done": True}
        items = await stream.next_batch()
        return self._batch_answer(sid, stream, items)

    async def stream_cancel(self, sid: str) -> None:
        s = self._streams.get(sid)
        if s is not None and s.task is not None and not s.task.done():
            s.task.cancel()
        self._drop_stream(sid)

    def _drop_stream(self, sid: str) -> None:
        self._streams.pop(sid, None)

    # --- HTTP ---------------------------------------------------------------------------------
    async def handle_http(self, meta: Dict[str, Any], scope: Dict[str, Any], body: bytes):
        if self._peers:
            return await self._on_all_streaming(
                "handle_http", lambda: self._handle_http(meta, scope, body), meta, scope, body)
        return await self._handle_http(meta, scope, body)

    async def _handle_http(self, meta: Dict[str, Any], scope: Dict[str, Any], body: bytes):
        stream = _Stream()  # ASGI messages the app sends
        disconnected = asyncio.Event()
        body_sent = False

        async def receive():
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            stream.put(message)

        async def run():
            token = self._enter(meta)  # in this task's own context
            error = False
            try:
                if self._asgi_app is not None:
                    await self._asgi_app(scope, receive, send)
                else:
                    from starlette.requests import Request
                    from starlette.responses import Response
                    result = await self._call_user(self._method("__call__"),
                                                   (Request(scope, receive),), {})
                    if isinstance(result, Response):
                        await result(scope, receive, send)
                    else:
                        for m in http_util.object_to_messages(result):
                            await send(m)
                stream.finish()
            except asyncio.CancelledError:
                stream.finish()
            except BaseException as e:
                error = True
                logger.error("serve: request to %s failed:\n%s", self._deployment,
                             traceback.format_exc())
                stream.finish(e)
            finally:
                disconnected.set()
                self._leave(token, error)

        sid = uuid.uuid4().hex
        stream.task = asyncio.ensure_future(run())
        try:
            return await self._http_answer(stream, sid)
        except asyncio.CancelledError:
            # The request was cancelled (client gone, request_timeout_s, ray.cancel): the
            # handler sees CancelledError too.
            stream.task.cancel()
            raise

    async def _http_answer(self, stream: "_Stream", sid: str):
        status, headers, chunks = None, [], []
        while True:
            msgs = await stream.next_batch() if not stream.done or stream.items else []
            for m in msgs:
                t = m.get("type")
                if t == "http.response.start":
                    status = m["status"]
                    headers = [(bytes(k), bytes(v)) for k, v in m.get("headers", ())]
                elif t == "http.response.body":
                    chunks.append(bytes(m.get("body", b"")))
                    if not m.get("more_body", False):
                        return {"status": status or 200, "headers": headers,
                                "body": b"".join(chunks), "stream_id": None, "done": True}
            if stream.done and not stream.items:
                if status is None:  # failed (or answered nothing) before starting a response
                    err = stream.error
                    if err is not None and _is_backpressure(err):
                        raise err
                    return http_util.plain_response(500, "Internal Server Error")
                return {"status": status, "headers": headers, "body": b"".join(chunks),
                        "stream_id": None, "done": True}
            if status is not None and chunks:
                # The response streams: send what we have, the rest through stream_next.
                self._streams[sid] = _HttpStream(stream)
                return {"status": status, "headers": headers, "body": b"".join(chunks),
                        "stream_id": sid, "done": False}


def _is_backpressure(e: BaseException) -> bool:
    from torus.serve.exceptions import BackPressureError
    return isinstance(e, BackPressureError)


class _HttpStream(_Stream):
    """The rest of a streaming HTTP response: body chunks (bytes) from the ASGI messages."""

    def __init__(self, inner: _Stream):
        self._inner = inner
        self.task = inner.task
        self.last_read = time.monotonic()

    @property
    def done(self):
        return self._inner.done

    @property
    def items(self):
        return self._inner.items

    async def next_batch(self) -> List[Any]:
        self.last_read = time.monotonic()
        msgs = await self._inner.next_batch()
        out = []
        for m in msgs:
            if m.get("type") == "http.response.body":
                out.append(bytes(m.get("body", b"")))
        return out


def _bind_asgi(app, instance):
    """The `serve.ingress` app with its routes bound to this replica's instance."""
    binder = getattr(app, "_serve_bind", None)
    return binder(instance) if binder is not None else app
