"""@remote on classes: ActorClass, ActorHandle, ActorMethod; exit_actor; @method."""
from __future__ import annotations

import hashlib
import inspect
import threading
from typing import Any, Dict, Optional

from torus._private import actor_lifetime
from torus._private import options as _opts
from torus._private import serialization, worker


class ActorExit(BaseException):
    """Raised by exit_actor(); the executor turns it into status 2 (the actor exits)."""


def exit_actor():
    """Ends the current actor gracefully (Ray's `ray.actor.exit_actor`)."""
    from torus._private import executor
    if not executor.in_actor():
        raise TypeError("exit_actor API is called on a non-actor worker, which is not "
                        "supported. Use sys.exit() to exit a task worker.")
    raise ActorExit()


def method(*args, **kwargs):
    """@method(num_returns=..., ...) on an actor method: default options of that method."""
    valid = _opts.METHOD_OPTIONS
    for k in kwargs:
        if k not in valid:
            raise ValueError(f"Invalid option keyword {k} for actor methods.")
    _opts.validate({k: v for k, v in kwargs.items() if k in ("num_returns",
                                                              "concurrency_group")},
                   valid, "actor methods")

    def annotate(m):
        m.__torus_method_options__ = dict(kwargs)
        return m

    if len(args) == 1 and callable(args[0]) and not kwargs:
        return annotate(args[0])
    return annotate


def _is_async_class(cls) -> bool:
    for _, m in inspect.getmembers(cls):
        if inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m):
            return True
    return False


def _method_defaults(cls) -> Dict[str, Dict[str, Any]]:
    out = {}
    for name, m in inspect.getmembers(cls):
        o = getattr(m, "__torus_method_options__", None)
        if o:
            out[name] = o
    return out


class ActorClass:
    """What @remote returns for a class."""

    def __init__(self, cls, actor_options: Dict[str, Any]):
        _opts.validate(actor_options, _opts.ACTOR_OPTIONS, "actors")
        self.__ray_metadata__ = None
        self._cls = cls
        self._class_name = cls.__name__
        self._default_options = dict(actor_options)
        self._is_async = _is_async_class(cls)
        self._method_defaults = _method_defaults(cls)
        self._key = None
        self._pickled = None
        self._lock = threading.Lock()
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__doc__ = cls.__doc__

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actors cannot be instantiated directly. Instead of "
                        f"'{self._class_name}()', use '{self._class_name}.remote()'.")

    def __getstate__(self):
        return {"cls": self._cls, "opts": self._default_options}

    def __setstate__(self, s):
        self.__init__(s["cls"], s["opts"])

    def _export(self) -> str:
        with self._lock:
            if self._key is None:
                self._pickled = serialization.dumps_function(self._cls)
                self._key = "cls:" + hashlib.sha1(self._pickled).hexdigest()
        worker.export(self._key, self._pickled)
        return self._key

    def options(self, **actor_options):
        _opts.validate(actor_options, _opts.ACTOR_OPTIONS, "actors")
        merged = {**self._default_options, **actor_options}
        parent = self

        class ActorOptionWrapper:
            def remote(self, *args, **kwargs):
                return parent._remote(args, kwargs, merged)

            def bind(self, *a, **k):
                raise NotImplementedError("Ray DAG (.bind) is not implemented by Torus")

        return ActorOptionWrapper()

    def remote(self, *args, **kwargs):
        return self._remote(args, kwargs, self._default_options)

    def bind(self, *args, **kwargs):
        raise NotImplementedError("Ray DAG (.bind) is not implemented by Torus")

    def _remote(self, args, kwargs, opts):
        worker.ensure_initialized()
        core = worker.core()
        core_opts = _opts.captured(opts, _opts.actor_options(opts, self._class_name,
                                                             self._is_async))
        name = core_opts["name"]
        if opts.get("get_if_exists"):
            if not name:
                raise ValueError("The actor name must be specified to use `get_if_exists`.")
            existing = core.get_named_actor(name, core_opts["ray_namespace"])
            if existing:
                return ActorHandle(existing, self._class_name, self._method_defaults)
        key = self._export()
        encoded, keep = worker.encode_args(args, kwargs)
        try:
            actor_id = core.create_actor(key, encoded, core_opts)
        except Exception as e:
            mapped = worker.map_core_error(e)
            if opts.get("get_if_exists") and name:
                existing = core.get_named_actor(name, core_opts["ray_namespace"])
                if existing:  # lost a race with another creator: theirs it is
                    return ActorHandle(existing, self._class_name, self._method_defaults)
            if name and "already" in str(e).lower():
                raise ValueError(f"The name {name} (namespace={core_opts['ray_namespace'] or None})"
                                 f" is already taken. Please use a different name or get the "
                                 f"existing actor using ray.get_actor('{name}')") from None
            raise mapped from None
        del keep
        handle = ActorHandle(actor_id, self._class_name, self._method_defaults,
                             core_opts["max_task_retries"])
        detached = core_opts["detached"] if core_opts["lifetime_set"] else core.default_detached()
        if not detached:  # ends once its handles are gone (_private/actor_lifetime.py)
            actor_lifetime.owned(actor_id, handle._gen)
        return handle


class ActorMethod:
    def __init__(self, handle: "ActorHandle", name: str, opts: Optional[Dict[str, Any]] = None):
        self._handle = handle
        self._method_name = name
        self._opts = opts or {}

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actor methods cannot be called directly. Instead of running "
                        f"'object.{self._method_name}()', try "
                        f"'object.{self._method_name}.remote()'.")

    def options(self, **method_options):
        for k in method_options:
            if k not in _opts.METHOD_OPTIONS:
                raise ValueError(f"Invalid option keyword {k} for actor methods.")
        _opts.validate({k: v for k, v in method_options.items() if k == "num_returns"},
                       _opts.METHOD_OPTIONS, "actor methods")
        return ActorMethod(self._handle, self._method_name, {**self._opts, **method_options})

    def remote(self, *args, **kwargs):
        return self._handle._call(self._method_name, args, kwargs, self._opts)

    def bind(self, *a, **k):
        raise NotImplementedError("Ray DAG (.bind) is not implemented by Torus")


class ActorHandle:
    """A handle to an actor; picklable (pass it to tasks and other actors)."""

    def __init__(self, actor_id, class_name: str = "", method_defaults=None,
                 max_task_retries: int = 0):
        self._actor_id = actor_id
        self._class_name = class_name
        self._method_defaults = method_defaults or {}
        self._max_task_retries = max_task_retries
        self._plain_calls: Dict[str, Any] = {}  # method -> _core.TaskOptions of option-less calls
        self._gen = worker.generation()
        actor_lifetime.created(actor_id, self._gen)

    def __del__(self):
        gen = self.__dict__.get("_gen")  # absent if __init__ did not finish
        if gen is not None:
            try:
                actor_lifetime.dropped(self._actor_id, gen)
            except Exception:  # interpreter teardown: the module may be gone already
                pass

    def __getattr__(self, name):
        if name.startswith("__") and name != "__ray_terminate__":
            raise AttributeError(name)
        if name.startswith("_") and name not in ("__ray_terminate__", "__ray_ready__"):
            raise AttributeError(name)
        return ActorMethod(self, name, self._method_defaults.get(name))

    def _task_name(self, method_name):
        # The call's name in listings and the timeline: "Class.method", as Ray shows it.
        return f"{self._class_name}.{method_name}" if self._class_name else method_name

    def _call(self, method_name, args, kwargs, opts):
        worker.ensure_initialized()
        if not opts:
            # The common call: no per-call options. Its core options depend on the method's
            # name alone, so they are built once per handle and method.
            mo = self._plain_calls.get(method_name)
            if mo is None:
                mo = self._plain_calls[method_name] = worker.core().TaskOptions(
                    _opts.method_options({"max_task_retries": self._max_task_retries},
                                         self._task_name(method_name)))
            encoded, keep = worker.encode_args(args, kwargs) if (args or kwargs) else ([], None)
            try:
                oid = worker.core().submit_actor_task(self._actor_id, method_name, encoded, mo)
            except Exception as e:
                raise worker.map_core_error(e) from None
            del keep
            return _opts._object_ref_cls()(oid)
        if opts:
            _opts.validate({k: v for k, v in opts.items() if k == "num_returns"},
                           _opts.METHOD_OPTIONS, "actor methods")
        encoded, keep = worker.encode_args(args, kwargs)
        mo = dict(opts or {})
        mo.setdefault("max_task_retries", self._max_task_retries)  # the actor's, per call
        try:
            oid = worker.core().submit_actor_task(self._actor_id, method_name, encoded,
                                                  _opts.method_options(mo, self._task_name(method_name)))
        except Exception as e:
            raise worker.map_core_error(e) from None
        del keep
        return _opts.return_refs(oid, mo.get("num_returns"))

    def __reduce__(self):
        actor_lifetime.escaped(self._actor_id, self._gen)
        return (ActorHandle, (self._actor_id, self._class_name, self._method_defaults,
                              self._max_task_retries))

    def __hash__(self):
        return hash(self._actor_id)

    def __eq__(self, other):
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __repr__(self):
        from torus.object_ref import id_hex
        return f"Actor({self._class_name}, {id_hex(self._actor_id)})"

    @property
    def _ray_actor_id(self):
        return _ActorID(self._actor_id)


class _ActorID:
    def __init__(self, raw):
        self._raw = raw

    def hex(self):
        from torus.object_ref import id_hex
        return id_hex(self._raw)

    def binary(self):
        return self._raw if isinstance(self._raw, bytes) else str(self._raw).encode()

    def __eq__(self, o):
        return isinstance(o, _ActorID) and o._raw == self._raw

    def __hash__(self):
        return hash(self._raw)

    def __repr__(self):
        return f"ActorID({self.hex()})"
