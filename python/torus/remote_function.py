"""@remote on functions: RemoteFunction with .remote() and .options()."""
from __future__ import annotations

import functools
import hashlib
import inspect
import threading
from typing import Any, Dict

from torus._private import options as _opts
from torus._private import serialization, worker


class RemoteFunction:
    def __init__(self, function, task_options: Dict[str, Any]):
        if inspect.iscoroutinefunction(function):
            raise ValueError("'async def' should not be used for remote tasks. You can wrap "
                             "the async function with `asyncio.run(f())`.")
        _opts.validate(task_options, _opts.TASK_OPTIONS, "remote functions")
        self._function = function
        self._function_name = f"{function.__module__}.{function.__qualname__}"
        self._default_options = dict(task_options)
        self._key = None
        self._pickled = None
        self._lock = threading.Lock()
        self._opts_cache = {}
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Remote functions cannot be called directly. Instead of running "
                        f"'{self._function_name}()', try '{self._function_name}.remote()'.")

    def __getstate__(self):
        return {"_function": self._function, "_default_options": self._default_options,
                "_function_name": self._function_name}

    def __setstate__(self, state):
        self.__init__(state["_function"], state["_default_options"])

    def _export(self) -> str:
        """Pickles the function once (at the first call) and exports it to this cluster."""
        with self._lock:
            if self._key is None:
                self._pickled = serialization.dumps_function(self._function)
                self._key = "fn:" + hashlib.sha1(self._pickled).hexdigest()
        worker.export(self._key, self._pickled)
        return self._key

    def options(self, **task_options):
        _opts.validate(task_options, _opts.TASK_OPTIONS, "remote functions")
        merged = {**self._default_options, **task_options}
        parent = self
        cache = {}

        class FuncWrapper:
            def remote(self, *args, **kwargs):
                return parent._remote(args, kwargs, merged, cache)

            def bind(self, *a, **k):
                raise NotImplementedError("Ray DAG (.bind) is not implemented by Torus")

        return FuncWrapper()

    def remote(self, *args, **kwargs):
        return self._remote(args, kwargs, self._default_options, self._opts_cache)

    def bind(self, *args, **kwargs):
        raise NotImplementedError("Ray DAG (.bind) is not implemented by Torus")

    def _remote(self, args, kwargs, opts, cache):
        worker.ensure_initialized()
        # The core options of one set of options are computed once (per runtime: a new cluster
        # may differ); a soft node affinity is looked at on every call.
        gen = worker.generation()
        core_opts = cache.get(gen)
        if core_opts is None:
            core_opts = _opts.task_options(opts, self._function_name)
            strat = opts.get("scheduling_strategy")
            if not getattr(strat, "soft", False):
                cache.clear()
                cache[gen] = core_opts
        core_opts = _opts.captured(opts, core_opts)
        key = self._export()
        encoded, keep = worker.encode_args(args, kwargs)
        try:
            oid = worker.core().submit_task(key, encoded, core_opts)
        except Exception as e:
            raise worker.map_core_error(e) from None
        del keep
        return _opts.return_refs(oid, opts.get("num_returns"))
