"""Calls into C++ functions and actors of the same cluster (Ray's `ray.cross_language`).

Values cross as msgpack, as in Ray; the C++ side registered them with RAY_REMOTE.
"""
from __future__ import annotations

from torus._private import serialization, worker


def _args(args):
    from torus.object_ref import ObjectRef
    out = []
    for a in args:
        if isinstance(a, ObjectRef):
            out.append((True, a._id, []))
        else:
            out.append((False, serialization.msgpack_dumps(a), []))
    return out


class CppFunction:
    def __init__(self, name: str, opts=None):
        self._name = name
        self._opts = opts or {}

    def options(self, **opts):
        return CppFunction(self._name, {**self._opts, **opts})

    def remote(self, *args, **kwargs):
        from torus._private import options as _o
        from torus.object_ref import ObjectRef
        if kwargs:
            raise TypeError("C++ functions take positional arguments only")
        worker.ensure_initialized()
        o = _o.task_options(self._opts, self._name)
        o["language"] = "CPP"
        try:
            return ObjectRef(worker.core().submit_task(self._name, _args(args), o))
        except Exception as e:
            raise worker.map_core_error(e) from None


class CppActorClass:
    def __init__(self, create_function_name: str, class_name: str, opts=None):
        self._create = create_function_name
        self._class = class_name
        self._opts = opts or {}

    def options(self, **opts):
        return CppActorClass(self._create, self._class, {**self._opts, **opts})

    def remote(self, *args):
        from torus._private import options as _o
        worker.ensure_initialized()
        o = _o.actor_options(self._opts, self._class, False)
        o["language"] = "CPP"
        try:
            aid = worker.core().create_actor(self._create, _args(args), o)
        except Exception as e:
            raise worker.map_core_error(e) from None
        return _CppActorHandle(aid, self._class)


class _CppActorHandle:
    def __init__(self, actor_id, class_name):
        self._actor_id = actor_id
        self._class_name = class_name

    def task(self, method_name: str):
        handle = self

        class _M:
            def remote(self, *args):
                from torus.object_ref import ObjectRef
                try:
                    return ObjectRef(worker.core().submit_actor_task(
                        handle._actor_id, method_name, _args(args),
                        {"name": method_name, "language": "CPP"}))
                except Exception as e:
                    raise worker.map_core_error(e) from None
        return _M()


def cpp_function(function_name: str) -> CppFunction:
    """A C++ function registered with RAY_REMOTE(function_name)."""
    return CppFunction(function_name)


def cpp_actor_class(create_function_name: str, class_name: str) -> CppActorClass:
    """A C++ actor class: its factory function's RAY_REMOTE name and its class name."""
    return CppActorClass(create_function_name, class_name)


def java_function(*a, **k):
    raise NotImplementedError("cross_language.java_function is not implemented by Torus")


def java_actor_class(*a, **k):
    raise NotImplementedError("cross_language.java_actor_class is not implemented by Torus")
