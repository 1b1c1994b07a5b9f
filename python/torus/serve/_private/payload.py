"""A deployment's code and arguments as bytes for the controller and replicas: cloudpickle,
plus locks pickled as new unlocked locks (a FastAPI app holds one in its included routers,
and a lock's state means nothing in another process) and starlette's `State` by its dict (its
`__getattr__` recurses while pickle rebuilds it). No state."""
from __future__ import annotations

import collections
import io
import threading

import cloudpickle

_LOCK = type(threading.Lock())
_RLOCK = type(threading.RLock())


def _reducers():
    out = {_LOCK: lambda _: (threading.Lock, ()), _RLOCK: lambda _: (threading.RLock, ())}
    try:
        from starlette.datastructures import State
        out[State] = lambda st: (State, (dict(st._state),))
    except ImportError:
        pass
    return out


class _Pickler(cloudpickle.Pickler):
    dispatch_table = collections.ChainMap(_reducers(), cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    f = io.BytesIO()
    _Pickler(f, protocol=5).dump(obj)
    return f.getvalue()
