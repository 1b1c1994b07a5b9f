"""ObjectRef: a Python handle on one object id of the core worker, reference counted."""
from __future__ import annotations

import asyncio
import concurrent.futures
import string
import threading
from typing import Any

from torus._private import serialization, worker

_HEX = set(string.hexdigits)


def id_hex(object_id) -> str:
    if isinstance(object_id, (bytes, bytearray)):
        return bytes(object_id).hex()
    s = str(object_id)
    if "@" in s:  # a full object id: "<hex>@<owner host:port>" (src/core/reference_counter.h)
        s = s.split("@", 1)[0]
    return s if s and set(s) <= _HEX else s.encode().hex()


class ObjectRef:
    """A reference to an object (Ray's `ray.ObjectRef`).

    Adopts one local reference of the core worker: `put`/`submit_*` results come with it
    counted (`adopt=True`); refs unpickled from a value count one more (`add_ref`).
    """

    __slots__ = ("_id", "_gen", "__weakref__")

    def __init__(self, object_id, *, adopt: bool = True):
        self._id = object_id
        self._gen = worker._generation
        if not adopt:
            worker.core().add_ref(object_id)

    # --- identity -------------------------------------------------------------------------
    def binary(self) -> bytes:
        return self._id if isinstance(self._id, bytes) else str(self._id).encode()

    def hex(self) -> str:
        return id_hex(self._id)

    def id(self):
        return self._id

    def is_nil(self) -> bool:
        return not self._id

    def task_id(self):
        raise NotImplementedError("ObjectRef.task_id() is not implemented by Torus")

    def owner_address(self):
        raise NotImplementedError("ObjectRef.owner_address() is not implemented by Torus")

    def __hash__(self):
        return hash(self._id)

    def __eq__(self, other):
        return isinstance(other, ObjectRef) and other._id == self._id

    def __repr__(self):
        return f"ObjectRef({self.hex()})"

    # --- lifetime -------------------------------------------------------------------------
    def __del__(self):
        try:
            worker.release_ref(self._id, self._gen)
        except Exception:  # interpreter shutdown: the runtime is going away anyway
            pass

    def __reduce__(self):
        serialization.record_nested_id(self._id)
        return (_from_pickle, (self._id,))

    def __copy__(self):
        return ObjectRef(self._id, adopt=False)

    def __deepcopy__(self, memo):
        return ObjectRef(self._id, adopt=False)

    # --- waiting --------------------------------------------------------------------------
    def _get_blocking(self) -> Any:
        return worker.get(self)

    def future(self) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                fut.set_result(self._get_blocking())
            except BaseException as e:  # delivered to the future's waiter
                fut.set_exception(e)

        threading.Thread(target=run, name="torus-ref-future", daemon=True).start()
        return fut

    def as_future(self) -> asyncio.Future:
        return asyncio.wrap_future(self.future())

    def __await__(self):
        loop = asyncio.get_event_loop()
        return loop.run_in_executor(_await_pool(), self._get_blocking).__await__()


def _from_pickle(object_id):
    return ObjectRef(object_id, adopt=False)


_pool = None
_pool_lock = threading.Lock()


def _await_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=64,
                                                          thread_name_prefix="torus-await")
        return _pool
