"""The router of one deployment in one process: picks a replica for each request.

Replicas come from the controller by long poll. A request goes to the less loaded of two replicas
drawn at random (power of two choices) among those with fewer than `max_ongoing_requests` of this
router's requests; when every replica is full (or none is up yet) it waits in this router's FIFO,
and past `max_queued_requests` waiting it is refused with `BackPressureError`. A call's slot is
given back when its caller reads the result, or, for a result nobody reads, when the completion
sweeper sees it done (it looks at results left unread for 50 ms, every 20 ms while requests
wait, else every 100 ms). A replica whose call failed because its actor died is dropped here at
once and reported to the controller, which replaces it.

For autoscaling, each router sends the controller its ongoing requests (sent + waiting) every
`metrics_interval_s`, and at once when a request waits with no replica up (scale from zero).

Threading: every method may be called from any thread; state is guarded by `_lock`. Submission
happens on the caller's thread when a replica is free, else on whichever thread frees a slot or
delivers a new replica set. Nothing here blocks on the network while holding `_lock`.
"""
from __future__ import annotations

import atexit
import collections
import logging
import random
import threading
import time
import uuid
from typing import Any, Deque, Dict, List, Optional, Tuple

from torus.serve._private.long_poll import LongPollClient, get_controller
from torus.serve.exceptions import BackPressureError, DeploymentUnavailableError

logger = logging.getLogger("torus.serve")


class _Replica:
    __slots__ = ("replica_id", "actor", "inflight", "models")

    def __init__(self, replica_id: str, actor):
        self.replica_id = replica_id
        self.actor = actor
        self.inflight = 0
        self.models: frozenset = frozenset()


class Request:
    """One call waiting for or holding a replica. `submit(replica)` sends it (no lock held)."""
    __slots__ = ("method", "meta", "args", "kwargs", "response", "replica", "done",
                 "deps", "sent_at", "model_id", "stream")

    def __init__(self, method: str, meta: dict, args: tuple, kwargs: dict, response):
        self.method = method
        self.meta = meta
        self.args = args
        self.kwargs = kwargs
        self.response = response
        self.replica: Optional[_Replica] = None
        self.done = False
        self.deps: List[Any] = []
        self.sent_at = 0.0
        self.model_id = meta.get("multiplexed_model_id", "")
        # A streaming call holds its slot until its reader sees the end, not until the first
        # batch's ref is ready (the sweeper leaves it alone).
        self.stream = method == "handle_request_streaming"


class Router:
    def __init__(self, app_name: str, deployment_name: str):
        self.app_name = app_name
        self.deployment_name = deployment_name
        self._lock = threading.Lock()
        self._replicas: Dict[str, _Replica] = {}
        self._choices: List[_Replica] = []
        self._max_ongoing = 5
        self._max_queued = -1
        self._queue: Deque[Request] = collections.deque()
        self._inflight_total = 0
        self._failed_message: Optional[str] = None
        self._exists = True
        self._autoscaling_interval: Optional[float] = None
        self._handle_id = uuid.uuid4().hex[:12]
        self._last_report = 0.0
        self._reported_zero = True
        self._poll = LongPollClient(f"replicas/{app_name}/{deployment_name}", self._update)
        self._poll.wait_first(10.0)
        _Sweeper.get().add_router(self)

    # --- replica set ------------------------------------------------------------------------
    def _update(self, value: dict) -> None:
        ready: List[Request] = []
        with self._lock:
            if value is None:  # the deployment is gone
                self._exists = False
                self._replicas, self._choices = {}, []
            else:
                self._exists = True
                self._max_ongoing = value["max_ongoing_requests"]
                self._max_queued = value["max_queued_requests"]
                self._failed_message = value.get("deploy_failed")
                self._autoscaling_interval = value.get("metrics_interval_s")
                reps = {}
                for rid, actor, models in value["replicas"]:
                    r = self._replicas.get(rid) or _Replica(rid, actor)
                    r.models = frozenset(models or ())
                    reps[rid] = r
                self._replicas = reps
                self._choices = list(reps.values())
            ready = self._assign_queued()
        self._send(ready)
        if value is None:
            self._fail_queue(lambda: DeploymentUnavailableError(
                f"Deployment(name='{self.deployment_name}', app='{self.app_name}')"))
        elif self._failed_message and not self._choices:
            self._fail_queue(lambda: DeploymentUnavailableError(
                f"Deployment(name='{self.deployment_name}', app='{self.app_name}')"))

    def _fail_queue(self, make_error) -> None:
        with self._lock:
            waiting, self._queue = list(self._queue), collections.deque()
        for req in waiting:
            req.response._fail(make_error())

    def replica_died(self, replica_id: str, message: str = "") -> None:
        """A call to `replica_id` failed because its actor is gone: stop routing to it and have
        the controller replace it."""
        with self._lock:
            r = self._replicas.pop(replica_id, None)
            if r is None:
                return
            self._choices = list(self._replicas.values())
        ctl = get_controller()
        if ctl is not None:
            try:
                ctl.report_replica_died.remote(replica_id)
            except Exception:
                pass

    # --- requests ---------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Sends `req` to a replica now if one has room, else queues it (or refuses it)."""
        with self._lock:
            if not self._exists:
                err = DeploymentUnavailableError(
                    f"Deployment(name='{self.deployment_name}', app='{self.app_name}')")
            elif self._failed_message and not self._choices:
                err = DeploymentUnavailableError(
                    f"Deployment(name='{self.deployment_name}', app='{self.app_name}')")
            else:
                err = None
                rep = None if req.deps or self._queue else self._pick(req)
                if rep is None:
                    if self._max_queued != -1 and len(self._queue) >= self._max_queued:
                        err = BackPressureError(len(self._queue), self._max_queued)
                    else:
                        self._queue.append(req)
                        if not self._choices:
                            self._last_report = 0.0  # scale from zero: tell the controller now
                else:
                    self._take(rep, req)
        if err is not None:
            req.response._fail(err)
            return
        if req.replica is not None:
            self._send([req])
        elif req.deps:
            for d in req.deps:
                d._on_assigned(self._deps_ready)
        if not self._choices:
            _Sweeper.get().report_now(self)

    def _deps_ready(self) -> None:
        with self._lock:
            ready = self._assign_queued()
        self._send(ready)

    def _pick(self, req: Request) -> Optional[_Replica]:
        """Power of two choices among replicas with room (models first, when asked for one).
        Requires _lock."""
        choices = self._choices
        n = len(choices)
        if n == 0:
            return None
        if req.model_id:
            with_model = [r for r in choices if req.model_id in r.models
                          and r.inflight < self._max_ongoing]
            if with_model:
                return min(random.sample(with_model, min(2, len(with_model))),
                           key=lambda r: r.inflight)
        if n == 1:
            r = choices[0]
            return r if r.inflight < self._max_ongoing else None
        a, b = random.sample(choices, 2)
        best = a if a.inflight <= b.inflight else b
        if best.inflight < self._max_ongoing:
            return best
        free = [r for r in choices if r.inflight < self._max_ongoing]
        return min(free, key=lambda r: r.inflight) if free else None

    def _take(self, rep: _Replica, req: Request) -> None:
        rep.inflight += 1
        self._inflight_total += 1
        req.replica = rep

    def _assign_queued(self) -> List[Request]:
        """Queued requests that can go now, in order. Requires _lock."""
        out = []
        while self._queue:
            req = self._queue[0]
            if req.deps and not all(d._assigned() for d in req.deps):
                break
            rep = self._pick(req)
            if rep is None:
                break
            self._queue.popleft()
            self._take(rep, req)
            out.append(req)
        return out

    def _send(self, reqs: List[Request]) -> None:
        for req in reqs:
            args = tuple(a._ref_now() if _is_response(a) else a for a in req.args)
            kwargs = {k: (v._ref_now() if _is_response(v) else v) for k, v in req.kwargs.items()}
            try:
                ref = getattr(req.replica.actor, req.method).remote(req.meta, *args, **kwargs)
            except Exception as e:  # the actor is gone or the arguments cannot be sent
                self.release(req)
                req.response._fail(e)
                continue
            req.sent_at = time.monotonic()
            req.response._assign(ref, req)
            if not req.stream:
                _Sweeper.get().watch(req)

    def resend(self, req: Request) -> None:
        """`req` failed without running (its replica was dead): its slot is given back and it
        is routed again."""
        with self._lock:
            rep, req.replica = req.replica, None
            if rep is not None and not req.done:
                rep.inflight -= 1
                self._inflight_total -= 1
            req.done = False
        self.submit(req)

    def release(self, req: Request) -> None:
        """The call of `req` ended: its slot goes to the next waiting request."""
        with self._lock:
            if req.done:
                return
            req.done = True
            req.response = None  # no cycle response <-> request once done
            req.args = req.kwargs = None
            rep, req.replica = req.replica, None
            if rep is not None:
                rep.inflight -= 1
                self._inflight_total -= 1
            ready = self._assign_queued() if self._queue else []
        if ready:
            self._send(ready)

    # --- metrics ----------------------------------------------------------------------------
    def ongoing(self) -> Tuple[int, int]:
        with self._lock:
            return self._inflight_total, len(self._queue)

    def has_waiters(self) -> bool:
        return bool(self._queue)

    def maybe_report(self, now: float, force: bool = False) -> None:
        interval = self._autoscaling_interval
        if interval is None:
            return
        if not force and now - self._last_report < interval:
            return
        sent, queued = self.ongoing()
        total = sent + queued
        if total == 0 and self._reported_zero and not force:
            self._last_report = now
            return
        self._last_report = now
        self._reported_zero = total == 0
        ctl = get_controller()
        if ctl is None:
            return
        try:
            ctl.record_handle_metrics.remote(self.app_name, self.deployment_name,
                                             self._handle_id, total, queued, time.time())
        except Exception:
            pass


def _is_response(v) -> bool:
    from torus.serve.handle import DeploymentResponse
    return isinstance(v, DeploymentResponse)


class _Sweeper:
    """One thread per process: gives back the slots of calls whose results nobody read, and
    sends the routers' autoscaling metrics."""
    _instance: Optional["_Sweeper"] = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> "_Sweeper":
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = _Sweeper()
                inst = cls._instance
        return inst

    def __init__(self):
        self._lock = threading.Lock()
        self._watched: Deque[Request] = collections.deque()
        self._routers: List[Router] = []
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="serve-sweeper", daemon=True).start()

    def add_router(self, r: Router) -> None:
        with self._lock:
            self._routers.append(r)

    def watch(self, req: Request) -> None:
        self._watched.append(req)  # deque.append is atomic

    @staticmethod
    def _release(q: Request) -> None:
        resp = q.response
        if resp is not None:
            resp._router.release(q)

    def report_now(self, r: Router) -> None:
        r._last_report = 0.0
        self._wake.set()

    def _run(self) -> None:
        from torus._private import worker
        while True:
            busy = any(r.has_waiters() for r in list(self._routers))
            self._wake.wait(0.02 if busy else 0.1)
            self._wake.clear()
            if worker.is_initialized():
                self._sweep(worker)  # its locals go when it returns (no handle kept here)

    def _sweep(self, worker) -> None:
        now = time.monotonic()
        old: List[Request] = []
        keep: List[Request] = []
        while self._watched:
            try:
                req = self._watched.popleft()
            except IndexError:
                break
            if req.done:
                continue
            (old if now - req.sent_at >= 0.05 else keep).append(req)
        self._watched.extend(keep)
        if old:
            pairs = [(q, q.response) for q in old]
            pairs = [(q, r, r._ref) for q, r in pairs if r is not None]
            old = [q for q, r, ref in pairs if ref is not None]
            ids = [ref._id for _, _, ref in pairs if ref is not None]
            del pairs
            try:
                flags = worker.core().wait(ids, len(ids), 0) if ids else []
            except Exception:
                flags = [True] * len(old)
            for q, f in zip(old, flags):
                if f:
                    self._release(q)
                else:
                    self._watched.append(q)
        for r in list(self._routers):
            try:
                r.maybe_report(now)
            except Exception:
                logger.debug("serve: metrics report failed", exc_info=True)


_routers: Dict[Tuple[str, str], Router] = {}
_routers_lock = threading.Lock()


def get_router(app_name: str, deployment_name: str) -> Router:
    key = (app_name, deployment_name)
    r = _routers.get(key)
    if r is None:
        with _routers_lock:
            r = _routers.get(key)
            if r is None:
                r = _routers[key] = Router(app_name, deployment_name)
    return r


def reset_routers() -> None:
    """Forgets every router (serve.shutdown / a new cluster)."""
    with _routers_lock:
        for r in _routers.values():
            r._poll.stop()
            r._replicas, r._choices = {}, []
        _routers.clear()
    sw = _Sweeper._instance
    if sw is not None:
        with sw._lock:
            sw._routers.clear()
        sw._watched.clear()


atexit.register(reset_routers)  # the routers' actor handles go before the core does
