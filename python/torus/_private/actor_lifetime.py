"""Automatic termination of actors whose handles are gone (Ray's actor lifetime).

A non-detached actor created by this process ends once no ActorHandle to it is left in this
process and none was serialized out of it. A serialized handle (passed to a task, put in an
object, pickled) may be held anywhere, which this process cannot see, so such an actor lives
until its job ends or `ray.kill()` (Ray counts those borrowers too; Torus keeps the actor
rather than guess). Termination is a `__ray_terminate__` call, queued behind the calls already
submitted, so they finish first as in Ray; the actor runs `__ray_shutdown__` if it defines one.

THREADS: `owned`, `created` and `escaped` run on any thread (RLock). `dropped` runs from
ActorHandle.__del__, i.e. at any GC point of any thread, possibly inside another function of this
module, so it only puts the id on a SimpleQueue. One daemon thread, started with the first owned
actor, applies the drops and submits the terminations.
"""
from __future__ import annotations

import queue
import threading
from typing import Dict, Set, Tuple

from torus._private import worker

Key = Tuple[int, str]  # (worker generation, actor id): a shutdown starts a new generation

_lock = threading.RLock()
_owned: Set[Key] = set()      # created here, not detached, not yet terminated
_live: Dict[Key, int] = {}    # handles in this process to an owned actor
_escaped: Set[Key] = set()    # owned actors whose handle was serialized
_drops: "queue.SimpleQueue[Key]" = queue.SimpleQueue()
_thread = None


def owned(actor_id: str, gen: int) -> None:
    """The handle just made by ActorClass.remote() for a non-detached actor (count 1)."""
    global _thread
    key = (gen, actor_id)
    with _lock:
        _owned.add(key)
        _live[key] = 1
        if _thread is None:
            _thread = threading.Thread(target=_run, name="torus-actor-lifetime", daemon=True)
            _thread.start()


def created(actor_id: str, gen: int) -> None:
    """Another handle to the actor appeared in this process (get_actor, unpickled)."""
    key = (gen, actor_id)
    with _lock:
        if key in _owned:
            _live[key] += 1


def escaped(actor_id: str, gen: int) -> None:
    """A handle is being serialized: the actor may now be used from elsewhere."""
    key = (gen, actor_id)
    with _lock:
        if key in _owned:
            _escaped.add(key)


def dropped(actor_id: str, gen: int) -> None:
    key = (gen, actor_id)
    if key in _owned:  # a set lookup: safe at any GC point
        _drops.put(key)


def _run() -> None:
    while True:
        key = _drops.get()
        with _lock:
            if key not in _owned:
                continue
            _live[key] -= 1
            if _live[key] > 0:
                continue
            _owned.discard(key)
            del _live[key]
            if key in _escaped:
                _escaped.discard(key)
                continue
        _terminate(key)


def _terminate(key: Key) -> None:
    gen, actor_id = key
    if gen != worker.generation() or not worker.is_initialized():
        return
    from torus._private import options as _opts
    try:
        oid = worker.core().submit_actor_task(
            actor_id, "__ray_terminate__", [], _opts.method_options({}, "__ray_terminate__"))
        worker.core().remove_ref(oid)
    except Exception:  # the actor is already gone, or the runtime shut down meanwhile
        pass
