"""The Serve controller: one detached actor (`SERVE_CONTROLLER_ACTOR` in namespace `serve`)
that owns applications, deployments, replicas and proxies, and makes the cluster match them.

State and durability: what users asked for (HTTP options, applications with their deployments'
code, arguments and options) and the replicas that run them are written to the head's key-value
store (namespace `serve`, key `checkpoint`) on every change, so the state survives a head
restart or failover with the head's store. The actor restarts without limit; a restarted
controller reads the checkpoint, finds its replicas and proxies again by their names (detached
actors keep running meanwhile, and so does traffic) and goes on.

Reconciliation runs every 100 ms and on events: start replicas up to the target count, replace
dead or unhealthy ones, roll a new version out by starting new replicas before stopping old ones
(the old ones leave the routers' replica set first, then finish what they hold:
`graceful_shutdown_timeout_s`), scale by the autoscaling policy, and keep one proxy per node.
Each running replica is pinged (`stats`) every second, which is also how a SIGKILLed replica is
noticed within a second when no router reported it sooner; `check_health` runs every
`health_check_period_s`.

Routers and proxies learn changes by long poll (`listen_for_change`).

Parts (mixins of ServeController, one concern per file): controller_checkpoint.py (durability),
controller_replicas.py (replicas and their lifecycle), controller_proxies.py (HTTP proxies),
controller_reports.py (status, details, metrics, the declarative config); the records are in
controller_model.py. This file: the long poll, the API drivers call, and the loop.

Threading: an async actor; all state is touched on its event loop only. Calls from other
processes (deploy, status, long polls) each hold one of the actor's call threads while they run.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import traceback
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torus
from torus._private import worker as _worker
from torus.serve._private.autoscaling import AutoscalingState
from torus.serve._private.controller_checkpoint import CheckpointMixin
from torus.serve._private.controller_proxies import ProxiesMixin
from torus.serve._private.controller_replicas import ReplicasMixin
from torus.serve._private.controller_reports import ReportsMixin
from torus.serve._private.controller_model import (CHECKPOINT_KEY, CHECKPOINT_NS,
                                                   LONG_POLL_TIMEOUT_S, TICK_S, Application,
                                                   Deployment, _payload_key)
from torus.serve.handle import _await_ref

logger = logging.getLogger("torus.serve")


class ServeController(CheckpointMixin, ReplicasMixin, ProxiesMixin, ReportsMixin):
    def __init__(self, http_options: Dict[str, Any]):
        self._http_options = http_options
        self._apps: Dict[str, Application] = {}
        self._incarnation = uuid.uuid4().hex[:8]
        self._lp_versions: Dict[str, Tuple[str, int]] = {}
        self._lp_values: Dict[str, Any] = {}
        self._lp_events: Dict[str, asyncio.Event] = {}
        self._proxies: Dict[str, Dict[str, Any]] = {}  # node id -> {actor, state, name}
        self._loop_task: Optional[asyncio.Task] = None
        self._shutting_down = False
        self._dirty = False
        self._wake: Optional[asyncio.Event] = None
        self._proxies_checked = 0.0
        self._config_version_seen: Optional[str] = None  # REST/`serve deploy` config applied
        self._config_task: Optional[asyncio.Task] = None
        self._last_kv_poll = 0.0
        self._details_written = ""
        self._last_details = 0.0
        self._recovered = self._load_checkpoint()

    async def ready(self) -> bool:
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._round_done = asyncio.Event()
            self._loop_task = asyncio.ensure_future(self._run())
            for app in self._apps.values():
                for d in app.deployments.values():
                    for r in d.replicas:
                        if r.state == "STOPPING":  # recovered mid-stop: finish stopping it
                            asyncio.ensure_future(self._drain(d, r))
                    self._publish_replicas(d)
            self._publish_routes()
        return True

    def _publish(self, key: str, value: Any) -> None:
        # Versions carry this controller's incarnation: a restarted controller's first
        # versions never equal what a client saw from the one before.
        n = self._lp_versions.get(key, (self._incarnation, 0))[1] + 1
        self._lp_versions[key] = (self._incarnation, n)
        self._lp_values[key] = value
        ev = self._lp_events.pop(key, None)
        if ev is not None:
            ev.set()

    async def listen_for_change(self, key: str, version) -> Tuple[Any, Any]:
        await self.ready()  # a restarted controller publishes its recovered state first
        cur = self._lp_versions.get(key, (self._incarnation, 0))
        if cur != version:
            return cur, self._lp_values.get(key)
        ev = self._lp_events.get(key)
        if ev is None:
            ev = self._lp_events[key] = asyncio.Event()
        try:
            await asyncio.wait_for(ev.wait(), LONG_POLL_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass
        return self._lp_versions.get(key, (self._incarnation, 0)), self._lp_values.get(key)

    def _publish_replicas(self, d: Deployment) -> None:
        if d.deleting:
            value = None
        else:
            auto = d.config.get("autoscaling_config")
            value = {
                "replicas": [(f"{d.app}#{d.name}#{r.replica_id}", r.actor, list(r.models))
                             for r in d.replicas if r.state == "RUNNING"],
                "max_ongoing_requests": d.config["max_ongoing_requests"],
                "max_queued_requests": d.config["max_queued_requests"],
                "deploy_failed": d.failed_message or None,
                "metrics_interval_s": auto["metrics_interval_s"] if auto else None,
            }
        sig = None if value is None else (
            tuple(x[0] for x in value["replicas"]), tuple(tuple(x[2]) for x in value["replicas"]),
            value["max_ongoing_requests"], value["max_queued_requests"],
            value["deploy_failed"], value["metrics_interval_s"])
        if sig != d.published or d.published is None:
            d.published = sig
            self._publish(d.key, value)

    def _publish_routes(self) -> None:
        routes = {app.route_prefix: (app.name, app.ingress) for app in self._apps.values()
                  if app.route_prefix is not None and not app.deleting}
        self._publish("routes", routes)

    async def pid(self) -> int:
        import os
        return os.getpid()

    async def get_http_options(self) -> Dict[str, Any]:
        return self._http_options

    async def deploy_application(self, name: str, route_prefix: Optional[str], ingress: str,
                                 deployments: List[Tuple[str, bytes, dict]],
                                 config: Optional[dict] = None) -> None:
        await self.ready()
        if route_prefix is not None:
            for other in self._apps.values():
                if other.name != name and other.route_prefix == route_prefix and \
                        not other.deleting:
                    raise ValueError(f"Prefix {route_prefix} is being used by application "
                                     f"\"{other.name}\". Failed to deploy application "
                                     f"\"{name}\".")
        app = self._apps.get(name)
        if app is None or app.deleting:
            if app is not None:  # being deleted: wait for that to finish first
                while name in self._apps:
                    await asyncio.sleep(0.05)
            app = self._apps[name] = Application(name)
        app.route_prefix, app.ingress, app.config = route_prefix, ingress, config
        app.build_error = ""
        app.deployed_at = time.time()
        wanted = {dname for dname, _, _ in deployments}
        for dname, payload, cfg in deployments:
            d = app.deployments.get(dname)
            if d is None or d.deleting:
                d = app.deployments[dname] = Deployment(name, dname)
            code_version = cfg.get("version") or hashlib.sha1(
                payload + repr(sorted((cfg.get("ray_actor_options") or {}).items())).encode()
                + repr(cfg.get("placement_group_bundles")).encode()
                + (b"" if cfg.get("version") else uuid.uuid4().bytes)).hexdigest()[:16]
            light = repr([cfg.get(k) for k in ("user_config", "max_ongoing_requests",
                                                "max_queued_requests", "graceful_shutdown_timeout_s",
                                                "graceful_shutdown_wait_loop_s",
                                                "health_check_period_s",
                                                "health_check_timeout_s")])
            cfg_version = hashlib.sha1(light.encode()).hexdigest()[:16]
            if code_version != d.version:
                d.payload = payload
                # The code and arguments (possibly large: a model's weights) are stored once
                # per version, apart from the checkpoint that is rewritten on every change.
                _worker.core().kv_put(CHECKPOINT_NS, _payload_key(name, dname, code_version),
                                      payload, True)
                if d.version:
                    self._drop_payload(name, dname, d.version)
            d.version = code_version
            d.config_version = cfg_version
            old_auto = d.config.get("autoscaling_config")
            d.config = cfg
            auto = cfg.get("autoscaling_config")
            if auto:
                if d.autoscaling is None or old_auto is None:
                    d.autoscaling = AutoscalingState(auto)
                    init = auto.get("initial_replicas")
                    d.target = init if init is not None else auto["min_replicas"]
                else:
                    d.autoscaling.update_config(auto)
                    d.target = max(auto["min_replicas"], min(auto["max_replicas"], d.target))
            else:
                d.autoscaling = None
                d.target = cfg["num_replicas"]
            d.failures, d.failed_message, d.retry_at = 0, "", 0.0
            d.status, d.status_trigger, d.message = "UPDATING", "CONFIG_UPDATE_STARTED", ""
            d.published = None
        for dname, d in app.deployments.items():
            if dname not in wanted:
                d.deleting = True
        self._publish_routes()
        self._save_checkpoint()
        self._kick()

    async def delete_applications(self, names: List[str]) -> None:
        await self.ready()
        for n in names:
            app = self._apps.get(n)
            if app is None:
                continue
            app.deleting = True
            for d in app.deployments.values():
                d.deleting = True
        self._publish_routes()
        self._save_checkpoint()
        self._kick()

    async def app_status(self, name: str) -> Optional[Dict[str, Any]]:
        await self.ready()
        app = self._apps.get(name)
        return None if app is None else self._app_status(app)

    async def wait_app(self, name: str, timeout_s: float = 1.0) -> Optional[Dict[str, Any]]:
        """The application's status once it is no longer DEPLOYING (or after timeout_s):
        checked after every reconcile round, so `serve.run` returns in the round its last
        replica started rather than on a polling period."""
        await self.ready()
        deadline = time.monotonic() + timeout_s
        while True:
            app = self._apps.get(name)
            st = None if app is None else self._app_status(app)
            left = deadline - time.monotonic()
            if st is None or st["status"] != "DEPLOYING" or left <= 0:
                return st
            ev = self._round_done
            try:
                await asyncio.wait_for(ev.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def list_applications(self) -> List[str]:
        return [n for n, a in self._apps.items() if not a.deleting]

    async def get_ingress(self, name: str) -> Optional[str]:
        app = self._apps.get(name)
        return None if app is None or app.deleting else app.ingress

    async def has_deployment(self, app_name: str, dep: str) -> bool:
        app = self._apps.get(app_name)
        return app is not None and dep in app.deployments and \
            not app.deployments[dep].deleting

    async def record_handle_metrics(self, app: str, dep: str, handle_id: str, ongoing: float,
                                    queued: float, sent_at: float) -> None:
        a = self._apps.get(app)
        d = a.deployments.get(dep) if a else None
        if d is not None and d.autoscaling is not None:
            d.autoscaling.record(handle_id, ongoing)
            if not self._active(d) and ongoing > 0:
                self._kick()

    async def report_replica_died(self, full_id: str) -> None:
        app, dep, rid = (full_id.split("#", 2) + ["", ""])[:3]
        a = self._apps.get(app)
        d = a.deployments.get(dep) if a else None
        if d is None:
            return
        for r in d.replicas:
            if r.replica_id == rid and r.state == "RUNNING" and not r.busy:
                r.last_ping = 0.0  # ping it now
        self._kick()

    async def shutdown(self) -> None:
        """Stops every application, replica and proxy; the driver kills this actor after."""
        self._shutting_down = True
        await self.delete_applications(list(self._apps))
        deadline = time.monotonic() + 30
        while self._apps and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in list(self._proxies.values()):
            try:
                await asyncio.wait_for(_await_ref(p["actor"].shutdown.remote()), 5)
            except Exception:
                pass
            try:
                torus.kill(p["actor"])
            except Exception:
                pass
        self._proxies.clear()
        try:
            _worker.core().kv_del(CHECKPOINT_NS, CHECKPOINT_KEY)
        except Exception:
            pass
        if self._loop_task is not None:
            self._loop_task.cancel()
        # No details left behind: the next controller's first round would otherwise be
        # preceded by this one's last text (an application RUNNING that is gone).
        try:
            _worker.core().kv_del(CHECKPOINT_NS, "details")
        except Exception:
            pass

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                return
            except Exception:
                logger.error("serve: controller loop error:\n%s", traceback.format_exc())
            done, self._round_done = self._round_done, asyncio.Event()
            done.set()  # wait_app callers look again
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _reconcile(self) -> None:
        now = time.monotonic()
        # Proxies follow node membership (a head call): every second, not every round.
        if not self._shutting_down and now - self._proxies_checked >= 1.0:
            self._proxies_checked = now
            await self._reconcile_proxies(now)
        for app in list(self._apps.values()):
            for d in list(app.deployments.values()):
                self._reconcile_deployment(d, now)
                if d.deleting and not d.replicas:
                    self._drop_payload(app.name, d.name, d.version)
                    del app.deployments[d.name]
                    self._publish(d.key, None)
                    self._dirty = True
            if app.deleting and not app.deployments:
                del self._apps[app.name]
                self._dirty = True
        if self._dirty:
            self._save_checkpoint()
        if now - self._last_kv_poll >= 0.5:
            self._last_kv_poll = now
            self._poll_deploy_config()
            self._write_details()
        if now - getattr(self, "_last_metrics", 0.0) >= 2.0:  # scrapes come every 15 s or so
            self._last_metrics = now
            self._write_metrics()
