"""Torus's Python API: Ray 2.60's Python API under Torus's name.

`python -m torus.ray prog.py` runs a program written for Ray with `import ray` resolved here.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

from torus import exceptions  # noqa: F401
from torus._private import worker as _worker
from torus._private.worker import get, init, is_initialized, put, shutdown, wait  # noqa: F401
from torus.actor import ActorClass, ActorHandle, method  # noqa: F401
from torus.object_ref import ObjectRef  # noqa: F401
from torus.remote_function import RemoteFunction
from torus.runtime_context import get_runtime_context  # noqa: F401
from torus import util  # noqa: F401

__version__ = "2.60.0"  # the Ray API version this package speaks
__torus_version__ = "0.1.0"


def remote(*args, **kwargs):
    """@remote / @remote(**options) on a function (a task) or a class (an actor)."""
    def make(target, opts):
        if inspect.isclass(target):
            return ActorClass(target, opts)
        if callable(target):
            return RemoteFunction(target, opts)
        raise TypeError("The @ray.remote decorator must be applied to either a function or a "
                        "class.")

    if len(args) == 1 and not kwargs and callable(args[0]):
        return make(args[0], {})
    if args:
        raise TypeError("The @ray.remote decorator must be applied either with no arguments "
                        "and no parentheses, for example '@ray.remote', or it must be applied "
                        "using some of the arguments in the list ['num_cpus', 'num_gpus', "
                        "'resources', ...], for example '@ray.remote(num_returns=2, "
                        "resources={\"CustomResource\": 1})'.")
    return lambda target: make(target, kwargs)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kills an actor at once (no_restart=False: it may restart within max_restarts)."""
    if not isinstance(actor, ActorHandle):
        raise ValueError(f"ray.kill() only supported for actors. For tasks, try ray.cancel(). "
                         f"Got: {type(actor)}.")
    _worker.ensure_initialized()
    try:
        _worker.core().kill_actor(actor._actor_id, bool(no_restart))
    except Exception as e:
        raise _worker.map_core_error(e) from None


def get_actor(name: str, namespace: Optional[str] = None) -> ActorHandle:
    """The live actor with this name (in namespace, default the current one)."""
    if not name:
        raise ValueError("Please supply a non-empty value to get_actor")
    if namespace is not None and not isinstance(namespace, str):
        raise TypeError("namespace must be None or a string")
    _worker.ensure_initialized()
    try:
        actor_id = _worker.core().get_named_actor(name, namespace or "")
    except Exception as e:
        raise _worker.map_core_error(e) from None
    if not actor_id:
        ns = namespace or _worker.current_namespace()
        raise ValueError(f"Failed to look up actor with name '{name}'. This could because 1. "
                         f"You are trying to look up a named actor you didn't create. 2. The "
                         f"named actor died. 3. You did not use a namespace matching the "
                         f"namespace of the actor. (namespace: {ns})")
    return ActorHandle(actor_id, name)


def cancel(ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancels the task that makes `ref`; get() on it then raises TaskCancelledError."""
    if not isinstance(ref, ObjectRef):
        raise TypeError("ray.cancel() only supported for object refs. For actors, try "
                        f"ray.kill(). Got: {type(ref)}.")
    _worker.ensure_initialized()
    try:
        # recursive (Ray's default): the tasks the cancelled one submitted are cancelled too,
        # and theirs in turn (not with force, which kills the task's worker).
        _worker.core().cancel(ref._id, bool(force), bool(recursive))
    except Exception as e:
        raise _worker.map_core_error(e) from None


def _node_entry(n: Dict[str, Any]) -> Dict[str, Any]:
    from torus.object_ref import id_hex
    addr = n.get("address", "") or ""
    host = addr.rsplit(":", 1)[0] if ":" in addr else addr
    port = addr.rsplit(":", 1)[1] if ":" in addr else ""
    total = {k: float(v) for k, v in (n.get("total") or {}).items()}
    return {
        "NodeID": id_hex(n.get("node_id")),
        "Alive": bool(n.get("alive")),
        "NodeManagerAddress": host,
        "NodeManagerHostname": n.get("hostname", ""),
        "NodeManagerPort": int(port) if port.isdigit() else 0,
        "NodeName": host,
        "Resources": total,
        "Labels": dict(n.get("labels") or {}),
        "alive": bool(n.get("alive")),
        "AvailableResources": {k: float(v) for k, v in (n.get("available") or {}).items()},
    }


def nodes() -> List[Dict[str, Any]]:
    """Every node the head knows: Ray's keys (NodeID, Alive, Resources, Labels, ...)."""
    _worker.ensure_initialized()
    try:
        return [_node_entry(dict(n)) for n in _worker.core().nodes()]
    except Exception as e:
        raise _worker.map_core_error(e) from None


def _sum(key: str) -> Dict[str, float]:
    out: Dict[str, float] = {}
    _worker.ensure_initialized()
    for n in _worker.core().nodes():
        if not n.get("alive"):
            continue
        for k, v in (n.get(key) or {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def _object_stores() -> List[dict]:
    """The object stores of the alive nodes (bytes used and capacity; those that answered)."""
    _worker.ensure_initialized()
    out = []
    for n in _worker.core().nodes():
        if n.get("alive"):
            s = _worker.core().node_store(n["address"])
            if s is not None:
                out.append(dict(s, node_id=n["node_id"]))
    return out


def cluster_resources() -> Dict[str, float]:
    """Total resources of the alive nodes, with their object stores' capacity as Ray's
    ``object_store_memory``."""
    out = _sum("total")
    stores = _object_stores()
    if stores:
        out["object_store_memory"] = float(sum(s["capacity"] for s in stores))
    return out


def available_resources() -> Dict[str, float]:
    """Resources of the alive nodes not in use now (``object_store_memory``: store bytes free)."""
    out = {k: v for k, v in _sum("available").items() if v > 0}
    free = sum(s["capacity"] - s["used"] for s in _object_stores())
    if free > 0:
        out["object_store_memory"] = float(free)
    return out


def get_gpu_ids() -> List[int]:
    return [int(g) for g in get_runtime_context().get_accelerator_ids().get("GPU", [])
            if g.isdigit()]


def timeline(filename: Optional[str] = None):
    """The cluster's recent tasks and actor calls as Chrome trace events (as ``ray.timeline``):
    the list of events, or None after writing them to ``filename`` as JSON (open it in
    https://ui.perfetto.dev or chrome://tracing)."""
    import json
    _worker.ensure_initialized()
    try:
        events = json.loads(_worker.core().timeline_json())
    except Exception as e:
        raise _worker.map_core_error(e) from None
    if filename is None:
        return events
    with open(filename, "w") as f:
        json.dump(events, f)
    return None


def java_function(*a, **k):
    raise NotImplementedError("ray.java_function (cross-language Java) is not implemented by "
                              "Torus")


def java_actor_class(*a, **k):
    raise NotImplementedError("ray.java_actor_class (cross-language Java) is not implemented "
                              "by Torus")


def client(*a, **k):
    raise NotImplementedError("Ray Client (ray.client) is not implemented by Torus")


class _Language:
    PYTHON = "PYTHON"
    CPP = "CPP"
    JAVA = "JAVA"


Language = _Language

__all__ = ["init", "shutdown", "is_initialized", "get", "put", "wait", "remote", "method",
           "kill", "get_actor", "cancel", "nodes", "cluster_resources", "available_resources",
           "get_runtime_context", "ObjectRef", "ActorHandle", "exceptions", "util",
           "get_gpu_ids"]


_LIBRARIES = ("data", "serve", "train")


def __getattr__(name: str):
    """`ray.data`, `ray.serve`, `ray.train` after a bare `import ray` (as Ray's package allows),
    imported on first use: the libraries' dependencies load only for programs that use them."""
    if name in _LIBRARIES:
        import importlib
        return importlib.import_module(f"torus.{name}")
    raise AttributeError(f"module 'torus' has no attribute {name!r}")
