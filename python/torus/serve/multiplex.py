"""`@serve.multiplexed`: a replica keeps up to `max_num_models_per_replica` models loaded, by
model id, evicting the least recently used one.

The replica reports its loaded model ids to the controller (with its pings), and routers send a
request that names a model (`serve_multiplexed_model_id` header or
`handle.options(multiplexed_model_id=...)`) to a replica holding it when one has room.
Threading: the cache lives on the replica's event loop; concurrent loads of one id share one
load.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import inspect
from typing import Callable, Optional


def multiplexed(func: Optional[Callable] = None, max_num_models_per_replica: int = 3):
    if isinstance(max_num_models_per_replica, bool) or \
            not isinstance(max_num_models_per_replica, int) or \
            (max_num_models_per_replica < 1 and max_num_models_per_replica != -1):
        raise ValueError("max_num_models_per_replica must be positive (or -1, no limit).")

    def decorate(fn):
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("@serve.multiplexed can only be used to decorate async functions "
                            "or methods.")
        params = list(inspect.signature(fn).parameters)
        is_method = bool(params) and params[0] == "self"
        if len(params) != (2 if is_method else 1):
            raise TypeError("@serve.multiplexed can only be used to decorate functions or "
                            "methods with at least one 'model_id: str' argument.")
        attr = f"__serve_models_{fn.__name__}"
        plain = {}

        @functools.wraps(fn)
        async def wrapper(*args):
            owner = args[0] if is_method else None
            model_id = args[-1]
            if not isinstance(model_id, str):
                raise TypeError("The model ID must be a string.")
            holder = owner.__dict__ if owner is not None else plain
            state = holder.get(attr)
            if state is None:
                state = holder[attr] = {"models": collections.OrderedDict(), "loading": {}}
                if owner is not None:
                    owner.__dict__["_serve_loaded_models"] = \
                        lambda: list(state["models"].keys())
            models = state["models"]
            if model_id in models:
                models.move_to_end(model_id)
                return models[model_id]
            pending = state["loading"].get(model_id)
            if pending is None:
                pending = state["loading"][model_id] = asyncio.ensure_future(fn(*args))
            try:
                model = await asyncio.shield(pending)
            finally:
                state["loading"].pop(model_id, None)
            if model_id not in models:
                while max_num_models_per_replica != -1 and \
                        len(models) >= max_num_models_per_replica:
                    _, old = models.popitem(last=False)
                    d = getattr(old, "__del__", None)
                    if callable(d):
                        try:
                            r = d()
                            if inspect.isawaitable(r):
                                await r
                        except Exception:
                            pass
                models[model_id] = model
            return models[model_id]

        return wrapper

    return decorate(func) if func is not None else decorate
