"""The worker side: `execute(kind, name, actor_id, args, max_concurrency)` (docs/python.md).

Called by `_core.run_worker` on the task's thread with the GIL held; returns
`(value_bytes, status, nested_ids)`: status 0 a value, 1 a user exception (an 'E' value),
2 the actor exits. Threaded actors (max_concurrency > 1) get concurrent calls from several
threads; an actor with any `async def` method runs its methods on one event-loop thread.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import threading
import traceback
from typing import Any, Dict, List, Tuple

from torus._private import runtime_env as _runtime_env
from torus._private import serialization

KIND_FUNCTION, KIND_CREATE, KIND_METHOD = 0, 1, 2
STATUS_OK, STATUS_ERROR, STATUS_EXIT = 0, 1, 2

_cache: Dict[str, Any] = {}
_cache_lock = threading.Lock()
_actors: Dict[Any, "_Actor"] = {}
_tls = threading.local()


class _Actor:
    def __init__(self, instance, is_async: bool, class_name: str):
        self.instance = instance
        self.class_name = class_name
        # Method name -> whether it is a generator (streaming returns, not implemented), looked
        # up once per name: inspect's checks cost several microseconds per call.
        self.generator: Dict[str, bool] = {}
        self.loop = None
        if is_async:
            self.loop = asyncio.new_event_loop()
            t = threading.Thread(target=self._run_loop, name="torus-actor-loop",
                                 daemon=True)
            t.start()

    def _run_loop(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


def in_actor() -> bool:
    return bool(_actors) or getattr(_tls, "actor_id", None) is not None


def current_actor_id():
    return getattr(_tls, "actor_id", None)


def _load(key: str):
    """A function or class from the head's KV (namespace `fn`), fetched once per process;
    `py:<module>:<name>` (a call from C++, include/torus/api/xlang.h) is imported by name."""
    obj = _cache.get(key)
    if obj is not None:
        return obj
    with _cache_lock:
        obj = _cache.get(key)
        if obj is None and key.startswith("py:"):
            import importlib
            _, module, name = key.split(":", 2)
            obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
            # A @remote function or class: the plain one underneath.
            obj = getattr(obj, "_function", None) or getattr(obj, "_cls", None) or obj
            _cache[key] = obj
        if obj is None:
            from torus._private import worker
            data = worker.core().kv_get("fn", key)
            if data is None or len(data) == 0:
                raise RuntimeError(f"function {key} was not found in the head's KV store "
                                   "(namespace 'fn')")
            obj = serialization.loads_function(data)
            if hasattr(obj, "__torus_unwrap__"):
                obj = obj.__torus_unwrap__()
            _cache[key] = obj
    return obj


def _decode_args(args) -> Tuple[List[Any], Dict[str, Any]]:
    vals = []
    names: Tuple[str, ...] = ()
    n = len(args)
    if n and serialization.kind_of(args[-1]) == serialization.KIND_KWARGS:
        names = serialization.deserialize(args[-1])
        n -= 1
    for i in range(n):
        v = serialization.deserialize(args[i])
        vals.append(v)
    for v in vals:
        from torus.exceptions import RayError
        if isinstance(v, RayError):  # a failed dependency: its error is this task's error
            raise _DependencyFailed(v)
    if names:
        k = len(names)
        return vals[:n - k], dict(zip(names, vals[n - k:]))
    return vals, {}


class _DependencyFailed(Exception):
    def __init__(self, err):
        super().__init__(str(err))
        self.err = err


def _encode_result(value, xlang: bool = False):
    if xlang:  # the caller is C++: msgpack, as in Ray's cross-language calls
        return serialization.msgpack_dumps(value), STATUS_OK, []
    n = getattr(_tls, "num_returns", 1)
    if n > 1:  # one value per return, each with its own packed refs
        try:
            values = list(value)
        except TypeError:
            raise ValueError(f"the task has num_returns={n} but returned a "
                             f"{type(value).__name__}, not a sequence of {n} values") from None
        if len(values) != n:
            raise ValueError(f"the task has num_returns={n} but returned {len(values)} "
                             f"value(s)")
        datas, nesteds = [], []
        for v in values:
            size, parts, nested = serialization.serialize(v)
            # Large values in pieces, as a single return's (the core copies them once).
            datas.append((size, parts) if size >= serialization.INLINE_LIMIT
                         else serialization.join(size, parts))
            nesteds.append(nested)
        return datas, STATUS_OK, nesteds, value
    size, parts, nested = serialization.serialize(value)
    # A large value goes back in pieces, (size, parts): the core copies them straight into the
    # store (one copy of a numpy array's memory, none in Python).
    data = (size, parts) if size >= serialization.INLINE_LIMIT else serialization.join(size, parts)
    # The value goes back too: the ObjectRefs in it must live until the core holds their ids
    # (a ref the task created would otherwise be freed as the task's frame goes).
    return data, STATUS_OK, nested, value


_NO_KWARGS: Dict[str, Any] = {}
_actor_exit_cls = None


def _actor_exit():
    """torus.actor.ActorExit (torus.actor imports this module, so it is looked up late, once)."""
    global _actor_exit_cls
    if _actor_exit_cls is None:
        from torus.actor import ActorExit
        _actor_exit_cls = ActorExit
    return _actor_exit_cls


class _LazyName:
    """A function's name for error messages, formatted only when one is needed: "Class.method",
    or a task's "module.qualname"."""
    __slots__ = ("owner", "name")

    def __init__(self, owner, name: str):
        self.owner, self.name = owner, name  # owner: a class name (str) or the function

    def __str__(self):
        if isinstance(self.owner, str):
            return f"{self.owner}.{self.name}"
        fn = self.owner
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', self.name)}"

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def _encode_error(e: BaseException, function_name: str, actor=None, actor_id=None):
    from torus.exceptions import RayTaskError
    if isinstance(e, _DependencyFailed):
        err = e.err
    else:
        # Drop this module's frames: the user's code is what matters.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        tb_text = "".join(traceback.format_exception(type(e), e, tb))
        # A nested task's error raised on: its user exception stays the cause, so a caller any
        # number of calls up still catches it by its type, as in Ray (whose dual exception
        # classes keep that type when pickled by value).
        cause = e.cause if isinstance(e, RayTaskError) and e.cause is not None else e
        err = RayTaskError(function_name, tb_text, cause, pid=os.getpid(),
                           actor_repr=repr(actor) if actor is not None else None,
                           actor_id=actor_id)
    try:
        data, nested = serialization.serialize_to_bytes(err, serialization.KIND_ERROR)
    except Exception as pe:  # the error itself does not pickle: send its text
        err = RayTaskError(function_name, f"{err}\n(while pickling the error: {pe})",
                           RuntimeError(str(err)), pid=os.getpid())
        data, nested = serialization.serialize_to_bytes(err, serialization.KIND_ERROR)
    return data, STATUS_ERROR, nested


def _exit_value():
    data, nested = serialization.serialize_to_bytes(None)
    return data, STATUS_EXIT, nested


def execute(kind: int, name: str, actor_id, args, max_concurrency: int = 1,
            num_returns: int = 1):
    """Runs one task; returns (data, status, nested refs[, value]). With num_returns > 1, data
    and nested are lists with one entry per return (an error is every return's value). The
    value, when there, keeps the ObjectRefs packed in data alive until the core holds them."""
    if num_returns <= 1:
        return _execute(kind, name, actor_id, args, max_concurrency)
    prev = getattr(_tls, "num_returns", 1)
    _tls.num_returns = num_returns
    try:
        res = _execute(kind, name, actor_id, args, max_concurrency)
    finally:
        _tls.num_returns = prev
    data, status, nested = res[0], res[1], res[2]
    if not isinstance(data, list):
        data, nested = [data] * num_returns, [nested] * num_returns
    return (data, status, nested) + tuple(res[3:])


def _execute(kind: int, name: str, actor_id, args, max_concurrency: int):
    ActorExit = _actor_exit()
    fname = name
    actor = None
    prev_actor = getattr(_tls, "actor_id", None)
    try:
        if not _runtime_env._applied:  # working_dir, py_modules: before any user code loads
            _runtime_env.ensure_applied()
        if kind == KIND_FUNCTION:
            fn = _load(name)
            fname = _LazyName(fn, name)
            a, kw = _decode_args(args) if args else ((), _NO_KWARGS)
            return _encode_result(fn(*a, **kw), name.startswith("py:"))
        if kind == KIND_CREATE:
            _tls.actor_id = actor_id
            cls = _load(name)
            fname = f"{cls.__name__}.__init__"
            a, kw = _decode_args(args)
            is_async = any(inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)
                           for _, m in inspect.getmembers(cls))
            instance = cls.__new__(cls)
            rec = _Actor(instance, is_async, cls.__name__)
            _actors[actor_id] = rec
            try:
                instance.__init__(*a, **kw)
            except BaseException:
                _actors.pop(actor_id, None)
                raise
            return _encode_result(None)
        if kind == KIND_METHOD:
            _tls.actor_id = actor_id
            rec = _actors.get(actor_id)
            if rec is None:
                raise RuntimeError(f"actor {actor_id!r} is not alive in this worker")
            actor = rec.instance
            fname = _LazyName(rec.class_name, name)
            if name == "__ray_terminate__":  # graceful: after the calls queued before it
                shutdown_hook = getattr(actor, "__ray_shutdown__", None)
                if callable(shutdown_hook):
                    shutdown_hook()
                raise ActorExit()
            if name == "__ray_ready__":
                return _encode_result(True)
            xlang = name.startswith("xlang:")
            if xlang:
                name = name[len("xlang:"):]
            m = getattr(actor, name)
            a, kw = _decode_args(args) if args else ((), _NO_KWARGS)
            if rec.loop is not None:
                if inspect.iscoroutinefunction(m):
                    coro = m(*a, **kw)
                else:
                    async def _sync():
                        return m(*a, **kw)
                    coro = _sync()
                fut = asyncio.run_coroutine_threadsafe(_with_actor(coro, actor_id), rec.loop)
                me = threading.get_ident()
                with _async_lock:
                    _async_waits[me] = fut
                try:
                    value = fut.result()
                finally:
                    with _async_lock:
                        _async_waits.pop(me, None)
                return _encode_result(value, xlang)
            gen = rec.generator.get(name)
            if gen is None:
                gen = rec.generator[name] = (inspect.isasyncgenfunction(m) or
                                             inspect.isgeneratorfunction(m))
            if gen:
                raise NotImplementedError("generator actor methods (streaming returns) are "
                                          "not implemented by Torus")
            return _encode_result(m(*a, **kw), xlang)
        raise ValueError(f"unknown task kind {kind}")
    except ActorExit:
        _actors.pop(actor_id, None)
        return _exit_value()
    except SystemExit as e:
        if kind != KIND_FUNCTION:  # sys.exit() in an actor ends the actor, as in Ray
            _actors.pop(actor_id, None)
            return _exit_value()
        return _encode_error(e, str(fname))
    except BaseException as e:  # the user's error travels to whoever gets the result
        from torus.exceptions import AsyncioActorExit
        if isinstance(e, AsyncioActorExit):
            _actors.pop(actor_id, None)
            return _exit_value()
        if kind == KIND_CREATE:
            # The constructor raised: the actor is dead, and its callers get ActorDiedError
            # with this text (docs/python.md: a creation's error is UTF-8 text, not a value).
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            text = (f"The actor died because of an error raised in its creation task, "
                    f"{fname} (pid={os.getpid()}):\n"
                    + "".join(traceback.format_exception(type(e), e, tb)))
            return text.encode("utf-8", "replace"), STATUS_ERROR, []
        if name.startswith(("py:", "xlang:")):
            # A C++ caller cannot unpickle an exception: its text becomes the C++ task error.
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            text = f"{fname} raised (pid={os.getpid()}):\n" + "".join(
                traceback.format_exception(type(e), e, tb))
            return text.encode("utf-8", "replace"), STATUS_ERROR, []
        return _encode_error(e, str(fname), actor, actor_id)
    finally:
        _tls.actor_id = prev_actor


# Async actor calls being waited for, by the waiting thread (cancel_async).
_async_lock = threading.Lock()
_async_waits = {}


def cancel_async(thread_ident: int) -> bool:
    """ray.cancel() of a running async actor call: cancels its coroutine (CancelledError in
    it); called by the core with the id of the thread waiting for the call."""
    with _async_lock:
        fut = _async_waits.get(thread_ident)
    return fut.cancel() if fut is not None else False


async def _with_actor(coro, actor_id):
    from torus.actor import ActorExit
    _tls.actor_id = actor_id
    try:
        return await coro
    except (ActorExit, SystemExit):  # would otherwise stop the actor's event loop
        from torus.exceptions import AsyncioActorExit
        raise AsyncioActorExit() from None


def actor_instance(actor_id=None):
    if actor_id is None:
        actor_id = current_actor_id()
    rec = _actors.get(actor_id)
    return rec.instance if rec else None
