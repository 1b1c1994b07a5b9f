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

Threading: an async actor; all state is touched on its event loop only. Calls from other
processes (deploy, status, long polls) each hold one of the actor's call threads while they run.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import pickle
import time
import traceback
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torus
from torus._private import worker as _worker
from torus.serve._private.autoscaling import AutoscalingState
from torus.serve.handle import _await_ref

logger = logging.getLogger("torus.serve")

CHECKPOINT_NS = "serve"
CHECKPOINT_KEY = "checkpoint"
LONG_POLL_TIMEOUT_S = 30.0
PING_PERIOD_S = 1.0
TICK_S = 0.1


class Replica:
    def __init__(self, replica_id: str, version: str, config_version: str, rank: int = 0):
        self.replica_id = replica_id  # unique within its deployment
        self.version = version
        self.config_version = config_version
        self.state = "STARTING"  # STARTING, RUNNING, STOPPING
        self.actor = None
        self.actor_name = ""
        self.pid: Optional[int] = None
        self.node_id = ""
        self.start_time = time.time()
        self.last_ping = time.monotonic()
        self.last_health = time.monotonic()
        self.busy = False  # a ping or health check is outstanding
        self.models: List[str] = []
        self.ongoing = 0
        self.metrics = None  # the replica's last metrics snapshot (rank 0's)
        self.task: Optional[asyncio.Task] = None
        self.pg = None  # the replica's placement group (placement_group_bundles)
        self.world = 1  # ranks: > 1 for a replica that spans the hosts of a TPU slice
        self.ranks: List[Any] = []  # every rank's actor (ranks[0] is `actor`)
        self.rank_nodes: List[str] = []


class Deployment:
    def __init__(self, app: str, name: str):
        self.app = app
        self.name = name
        self.payload = b""
        self.config: Dict[str, Any] = {}
        self.version = ""         # code version: a change replaces replicas
        self.config_version = ""  # user_config and the other light options
        self.replicas: List[Replica] = []
        self.target = 1
        self.autoscaling: Optional[AutoscalingState] = None
        self.failures = 0         # consecutive constructor failures
        self.failed_message = ""
        self.status = "UPDATING"
        self.status_trigger = "CONFIG_UPDATE_STARTED"
        self.message = ""
        self.deleting = False
        self.next_id = 0
        self.published = None
        self.retry_at = 0.0

    @property
    def key(self) -> str:
        return f"replicas/{self.app}/{self.name}"


class Application:
    def __init__(self, name: str):
        self.name = name
        self.route_prefix: Optional[str] = "/"
        self.ingress = ""
        self.deployments: Dict[str, Deployment] = {}
        self.deleting = False
        self.deployed_at = time.time()
        self.config: Optional[dict] = None  # the config-file form, when deployed from one
        self.build_error = ""  # importing or building it from its config failed


class ServeController:
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
        self._config_version_seen: Optional[str] = None  # REST/`serve deploy` config applied
        self._config_task: Optional[asyncio.Task] = None
        self._last_kv_poll = 0.0
        self._details_written = ""
        self._last_details = 0.0
        self._recovered = self._load_checkpoint()

    # --- startup and durability ---------------------------------------------------------------
    async def ready(self) -> bool:
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.ensure_future(self._run())
            for app in self._apps.values():
                for d in app.deployments.values():
                    for r in d.replicas:
                        if r.state == "STOPPING":  # recovered mid-stop: finish stopping it
                            asyncio.ensure_future(self._drain(d, r))
                    self._publish_replicas(d)
            self._publish_routes()
        return True

    def _load_checkpoint(self) -> bool:
        try:
            data = _worker.core().kv_get(CHECKPOINT_NS, CHECKPOINT_KEY)
        except Exception:
            data = None
        if not data:
            return False
        try:
            cp = pickle.loads(bytes(data))
        except Exception:
            logger.exception("serve: the controller's checkpoint is unreadable; starting empty")
            return False
        self._http_options = cp.get("http_options", self._http_options)
        for a in cp["apps"]:
            app = Application(a["name"])
            app.route_prefix, app.ingress = a["route_prefix"], a["ingress"]
            app.deployed_at, app.config = a["deployed_at"], a.get("config")
            app.deleting = a.get("deleting", False)
            for dd in a["deployments"]:
                d = Deployment(app.name, dd["name"])
                d.config = dd["config"]
                d.payload = dd.get("payload") or bytes(_worker.core().kv_get(
                    CHECKPOINT_NS, _payload_key(app.name, d.name, dd["version"])) or b"")
                d.version, d.config_version = dd["version"], dd["config_version"]
                d.target, d.next_id = dd["target"], dd["next_id"]
                d.deleting = dd.get("deleting", False)
                if d.config.get("autoscaling_config"):
                    d.autoscaling = AutoscalingState(d.config["autoscaling_config"])
                for rr in dd["replicas"]:
                    try:
                        actor = torus.get_actor(rr["actor_name"], namespace="serve")
                    except ValueError:
                        continue  # it died while no controller ran: the loop replaces it
                    r = Replica(rr["replica_id"], rr["version"], rr["config_version"],
                                rr.get("rank", 0))
                    r.world = rr.get("world", 1)
                    try:
                        r.ranks = [actor] + [torus.get_actor(f"{rr['actor_name']}#rank{i}",
                                                             namespace="serve")
                                             for i in range(1, r.world)]
                    except ValueError:  # a rank died meanwhile: the replica is replaced
                        r.ranks = [actor]
                        r.state = "STOPPING"
                    if rr.get("pg") is not None:
                        from torus.util.placement_group import PlacementGroup
                        r.pg = PlacementGroup(rr["pg"])
                    r.actor, r.actor_name, r.pid = actor, rr["actor_name"], rr.get("pid")
                    r.node_id, r.start_time = rr.get("node_id", ""), rr.get("start_time", 0)
                    if r.state != "STOPPING":
                        r.state = "RUNNING" if rr["state"] == "RUNNING" else "STOPPING"
                    d.replicas.append(r)
                app.deployments[d.name] = d
            self._apps[app.name] = app
        for node_id, name in cp.get("proxies", {}).items():
            try:
                self._proxies[node_id] = {"actor": torus.get_actor(name, namespace="serve"),
                                          "name": name, "state": "HEALTHY", "busy": False,
                                          "last_ping": time.monotonic()}
            except ValueError:
                pass
        return True

    def _save_checkpoint(self) -> None:
        self._dirty = False
        cp = {"http_options": self._http_options, "apps": [], "proxies": {
            n: p["name"] for n, p in self._proxies.items()}}
        for app in self._apps.values():
            cp["apps"].append({
                "name": app.name, "route_prefix": app.route_prefix, "ingress": app.ingress,
                "deployed_at": app.deployed_at, "config": app.config, "deleting": app.deleting,
                "deployments": [{
                    "name": d.name, "config": d.config,
                    "version": d.version, "config_version": d.config_version,
                    "target": d.target, "next_id": d.next_id, "deleting": d.deleting,
                    "replicas": [{"replica_id": r.replica_id, "actor_name": r.actor_name,
                                  "version": r.version, "config_version": r.config_version,
                                  "state": r.state, "pid": r.pid, "node_id": r.node_id,
                                  "start_time": r.start_time, "world": r.world,
                                  "pg": r.pg.id._raw if r.pg is not None else None}
                                 for r in d.replicas if r.actor_name]}
                    for d in app.deployments.values()]})
        try:
            _worker.core().kv_put(CHECKPOINT_NS, CHECKPOINT_KEY, pickle.dumps(cp), True)
        except Exception:
            logger.exception("serve: could not write the controller's checkpoint")

    # --- long poll ----------------------------------------------------------------------------
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

    # --- the API the driver calls ------------------------------------------------------------
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

    async def list_applications(self) -> List[str]:
        return [n for n, a in self._apps.items() if not a.deleting]

    async def get_ingress(self, name: str) -> Optional[str]:
        app = self._apps.get(name)
        return None if app is None or app.deleting else app.ingress

    async def has_deployment(self, app_name: str, dep: str) -> bool:
        app = self._apps.get(app_name)
        return app is not None and dep in app.deployments and \
            not app.deployments[dep].deleting

    async def status(self) -> Dict[str, Any]:
        await self.ready()
        return {"proxies": {n: p["state"] for n, p in self._proxies.items()},
                "applications": {n: self._app_status(a) for n, a in self._apps.items()}}

    async def details(self) -> Dict[str, Any]:
        """Serve's REST/dashboard view: applications, deployments, replicas."""
        return self._details_now()

    def _details_now(self) -> Dict[str, Any]:
        out = {"controller_info": {"node_id": torus.get_runtime_context().get_node_id(),
                                   "actor_name": "SERVE_CONTROLLER_ACTOR",
                                   "log_file_path": None},
               "proxy_location": str(self._http_options.get("location")),
               "http_options": {k: v for k, v in self._http_options.items()
                                if k in ("host", "port", "root_path", "request_timeout_s",
                                         "keep_alive_timeout_s")},
               "proxies": {n: {"node_id": n, "status": p["state"], "actor_name": p["name"]}
                           for n, p in self._proxies.items()},
               "applications": {}}
        for a in self._apps.values():
            st = self._app_status(a)
            out["applications"][a.name] = {
                "name": a.name, "route_prefix": a.route_prefix, "docs_path": None,
                "status": st["status"], "message": st["message"],
                "last_deployed_time_s": a.deployed_at, "deployed_app_config": a.config,
                "source": "declarative" if a.config else "imperative",
                "external_scaler_enabled": False,
                "deployments": {d.name: {
                    "name": d.name, "status": d.status, "status_trigger": d.status_trigger,
                    "message": d.message, "target_num_replicas": d.target,
                    "required_resources": _required_resources(d.config),
                    # Ray's DeploymentSchema: unset options are left out, not null.
                    "deployment_config": dict({k: v for k, v in d.config.items()
                                               if k != "version" and v is not None},
                                              name=d.name),
                    "replicas": [{"replica_id": r.replica_id, "state": r.state, "pid": r.pid,
                                  "node_id": r.node_id, "actor_name": r.actor_name,
                                  "start_time_s": r.start_time} for r in d.replicas],
                } for d in a.deployments.values()}}
        return out

    def _app_status(self, app: Application) -> Dict[str, Any]:
        deps = {d.name: {"status": d.status, "status_trigger": d.status_trigger,
                         "message": d.message,
                         "replica_states": self._replica_counts(d)}
                for d in app.deployments.values() if not d.deleting or app.deleting}
        if app.deleting:
            status, msg = "DELETING", ""
        elif app.build_error:
            status, msg = "DEPLOY_FAILED", app.build_error
        elif any(x["status"] == "DEPLOY_FAILED" for x in deps.values()):
            status = "DEPLOY_FAILED"
            msg = "; ".join(f"Deployment '{n}': {x['message']}" for n, x in deps.items()
                            if x["status"] == "DEPLOY_FAILED")
        elif any(x["status"] == "UPDATING" for x in deps.values()) or \
                any(d.deleting for d in app.deployments.values()):
            status, msg = "DEPLOYING", ""
        elif any(x["status"] == "UNHEALTHY" for x in deps.values()):
            status = "UNHEALTHY"
            msg = "; ".join(f"Deployment '{n}': {x['message']}" for n, x in deps.items()
                            if x["status"] == "UNHEALTHY")
        else:
            status, msg = "RUNNING", ""
        return {"status": status, "message": msg, "last_deployed_time_s": app.deployed_at,
                "deployments": deps}

    @staticmethod
    def _replica_counts(d: Deployment) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for r in d.replicas:
            out[r.state] = out.get(r.state, 0) + 1
        return out

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

    async def proxy_ports(self) -> Dict[str, Any]:
        return {n: p.get("port") for n, p in self._proxies.items()}

    @staticmethod
    def _drop_payload(app: str, dep: str, version: str) -> None:
        try:
            _worker.core().kv_del(CHECKPOINT_NS, _payload_key(app, dep, version))
        except Exception:
            pass

    # --- the loop -----------------------------------------------------------------------------
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
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _reconcile(self) -> None:
        now = time.monotonic()
        if not self._shutting_down:
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

    @staticmethod
    def _active(d: Deployment) -> List[Replica]:
        return [r for r in d.replicas if r.state in ("STARTING", "RUNNING")]

    def _reconcile_deployment(self, d: Deployment, now: float) -> None:
        # Pings and health checks of running replicas.
        for r in d.replicas:
            if r.state == "RUNNING" and not r.busy:
                hc = now - r.last_health >= d.config["health_check_period_s"]
                if hc or now - r.last_ping >= PING_PERIOD_S:
                    r.busy = True
                    r.task = asyncio.ensure_future(self._check(d, r, hc))
            if r.state == "RUNNING" and r.config_version != d.config_version and \
                    r.version == d.version and not r.busy:
                r.busy = True
                r.task = asyncio.ensure_future(self._reconfigure(d, r))
        if d.deleting:
            for r in self._active(d):
                self._stop(d, r)
            self._publish_replicas(d)
            return
        # Autoscaling: the policy moves the target.
        if d.autoscaling is not None and not d.failed_message:
            target = d.autoscaling.decide(d.target, now)
            if target != d.target:
                d.status_trigger = "AUTOSCALING"
                d.status = "UPSCALING" if target > d.target else "DOWNSCALING"
                d.target = target
                self._dirty = True
        new = [r for r in self._active(d) if r.version == d.version]
        old = [r for r in self._active(d) if r.version != d.version]
        # Start replicas of the current version up to the target; during a rollout at most
        # `surge` replicas over the target run (a failing constructor backs off, and after
        # enough failures the deployment is DEPLOY_FAILED).
        if not d.failed_message and now >= d.retry_at:
            to_start = d.target - len(new)
            if old:
                surge = max(1, math.ceil(0.2 * d.target))
                to_start = min(to_start, d.target + surge - len(new) - len(old))
            for _ in range(max(0, to_start)):
                self._start(d)
        # Old replicas go as new ones come up (never before: a failed rollout keeps them).
        for r in [r for r in old if r.state == "STARTING"]:
            self._stop(d, r)
        new_running = [r for r in new if r.state == "RUNNING"]
        old_running = [r for r in old if r.state == "RUNNING"]
        for r in old_running:
            if len(new_running) < d.target and \
                    len(new_running) + len([x for x in old_running if x.state == "RUNNING"]) \
                    <= d.target:
                break
            self._stop(d, r)
        new = [r for r in self._active(d) if r.version == d.version]
        if len(new) > d.target:  # scaling down: starting ones first, then the newest
            extra = sorted(new, key=lambda r: (r.state != "STARTING", -r.start_time))
            for r in extra[:len(new) - d.target]:
                self._stop(d, r)
        # Status.
        running = [r for r in d.replicas if r.state == "RUNNING" and r.version == d.version]
        if d.failed_message:
            d.status = "DEPLOY_FAILED" if not running else "UNHEALTHY"
            d.message = d.failed_message
        elif len(running) == d.target and not old and \
                all(r.config_version == d.config_version for r in running):
            if d.status != "HEALTHY":
                d.status_trigger = ("CONFIG_UPDATE_COMPLETED" if d.status == "UPDATING"
                                    else "UPSCALE_COMPLETED" if d.status == "UPSCALING"
                                    else "DOWNSCALE_COMPLETED" if d.status == "DOWNSCALING"
                                    else d.status_trigger)
            d.status, d.message = "HEALTHY", ""
        elif d.status in ("HEALTHY", "UPSCALING", "DOWNSCALING") and not old:
            d.status = "UPSCALING" if len(running) < d.target else "DOWNSCALING"
        self._publish_replicas(d)

    def _start(self, d: Deployment) -> None:
        from torus.serve._private.replica import ServeReplica
        from torus.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        rid = uuid.uuid4().hex[:8]
        r = Replica(rid, d.version, d.config_version)
        r.actor_name = f"SERVE_REPLICA::{d.app}#{d.name}#{rid}"
        d.replicas.append(r)
        cfg = d.config
        rao = dict(cfg.get("ray_actor_options") or {})
        opts = {"name": r.actor_name, "namespace": "serve", "lifetime": "detached",
                "max_restarts": 0,
                "max_concurrency": max(100, cfg["max_ongoing_requests"] * 4 + 16)}
        for k in ("num_cpus", "num_gpus", "memory", "resources", "runtime_env",
                  "label_selector", "scheduling_strategy", "accelerator_type"):
            if rao.get(k) is not None:
                opts[k] = rao[k]
        bundles = cfg.get("placement_group_bundles")
        world = 1
        if bundles:
            # Ray's rule: each replica reserves its bundles in a placement group of its own and
            # runs in bundle 0; what it starts lands in the group too. Bundles that are the
            # hosts of one TPU slice reserve one whole slice, atomically, and the replica runs
            # as one rank per host (a gang).
            try:
                shape = _slice_shape(bundles)
                if shape is not None:
                    from torus.util.tpu import SlicePlacementGroup
                    spg = SlicePlacementGroup(shape[0], shape[1], resources_per_bundle={
                        k: v for k, v in bundles[0].items() if k != "TPU"},
                        lifetime="detached", head_reservation_timeout_s=None)
                    r.pg = spg.placement_group
                    world = len(bundles)
                else:
                    from torus.util.placement_group import placement_group
                    r.pg = placement_group(bundles, strategy=cfg.get("placement_group_strategy")
                                           or "PACK", lifetime="detached")
            except Exception as e:
                d.replicas.remove(r)
                self._constructor_failed(d, f"could not reserve the replica's placement "
                                            f"group: {e}")
                return
        r.world = world
        try:
            for rank in range(world):
                o = dict(opts)
                if rank:
                    o["name"] = f"{r.actor_name}#rank{rank}"
                if r.pg is not None:
                    o["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                        r.pg, placement_group_bundle_index=rank,
                        placement_group_capture_child_tasks=True)
                r.ranks.append(torus.remote(ServeReplica).options(**o).remote(
                    d.app, d.name, rid, d.payload, cfg, rank, world))
        except Exception as e:
            self._remove(d, r, kill=True)
            self._constructor_failed(d, f"could not create the replica actor: {e}")
            return
        r.actor = r.ranks[0]
        self._dirty = True
        r.task = asyncio.ensure_future(self._initialize(d, r))

    async def _initialize(self, d: Deployment, r: Replica) -> None:
        try:
            user_config = d.config.get("user_config")
            if r.world == 1:
                meta = await _await_ref(r.actor.initialize.remote(user_config))
            else:
                # Rank 0's host is the JAX coordinator; every rank gets its address, and rank
                # 0 the other ranks, before the user's constructor runs on each.
                where = await _await_ref(r.actor.where.remote())
                gang = {"coordinator": f"{where['ip']}:{where['port']}",
                        "peers": r.ranks[1:]}
                metas = await asyncio.gather(*(_await_ref(a.initialize.remote(
                    user_config, dict(gang, peers=r.ranks[1:] if i == 0 else [])))
                    for i, a in enumerate(r.ranks)))
                meta = metas[0]
                r.rank_nodes = [m.get("node_id", "") for m in metas]
        except Exception as e:
            if r.state != "STARTING":
                return
            msg = _error_text(e)
            logger.warning("serve: replica %s of %s failed to start: %s", r.replica_id, d.name,
                           msg)
            self._remove(d, r, kill=True)
            self._constructor_failed(d, f"The deployment failed to start {d.failures + 1} "
                                        f"times in a row. This may be due to a problem with "
                                        f"its constructor or initial health check failing. "
                                        f"See controller logs for details. Error:\n{msg}")
            return
        if r.state != "STARTING":
            return
        r.pid, r.node_id = meta.get("pid"), meta.get("node_id", "")
        r.state = "RUNNING"
        r.last_ping = r.last_health = time.monotonic()
        d.failures = 0
        self._dirty = True
        self._kick()

    def _constructor_failed(self, d: Deployment, msg: str) -> None:
        d.failures += 1
        limit = d.config.get("max_constructor_retry_count") or min(20, max(3, 3 * d.target))
        d.message = msg
        if d.failures >= limit:
            d.failed_message = msg
            d.status, d.status_trigger = "DEPLOY_FAILED", "REPLICA_STARTUP_FAILED"
        d.retry_at = time.monotonic() + min(5.0, 0.1 * (2 ** min(d.failures, 6)))
        self._kick()

    async def _check(self, d: Deployment, r: Replica, health: bool) -> None:
        try:
            if health:
                await asyncio.wait_for(_await_ref(r.actor.check_health.remote()),
                                       d.config["health_check_timeout_s"])
                r.last_health = time.monotonic()
            stats = await asyncio.wait_for(asyncio.gather(*(
                _await_ref(a.stats.remote()) for a in (r.ranks or [r.actor]))),
                max(5.0, d.config["health_check_timeout_s"]))
            st = stats[0]  # a lost rank fails the gather: the whole replica is replaced
            r.last_ping = time.monotonic()
            r.ongoing = st.get("ongoing", 0)
            r.metrics = st.get("metrics")
            if st.get("models", []) != r.models:
                r.models = st.get("models", [])
                d.published = None
        except Exception as e:
            if r.state == "RUNNING":
                dead = _is_actor_death(e)
                logger.warning("serve: replica %s of %s/%s %s: %s", r.replica_id, d.app, d.name,
                               "died" if dead else "failed its health check", _error_text(e))
                d.status_trigger = "DEPLOYMENT_ACTOR_FAILED" if dead else "HEALTH_CHECK_FAILED"
                if not dead:
                    d.status = "UNHEALTHY"
                    d.message = f"A replica's health check failed: {_error_text(e)}"
                self._remove(d, r, kill=True)
        finally:
            r.busy = False
            self._kick()

    async def _reconfigure(self, d: Deployment, r: Replica) -> None:
        version = d.config_version
        try:
            await _await_ref(r.actor.reconfigure.remote(d.config.get("user_config")))
            r.config_version = version
        except Exception as e:
            logger.warning("serve: reconfigure of replica %s failed: %s", r.replica_id,
                           _error_text(e))
            self._remove(d, r, kill=True)
        finally:
            r.busy = False
            self._dirty = True
            self._kick()

    def _stop(self, d: Deployment, r: Replica) -> None:
        if r.state == "STOPPING":
            return
        was_starting = r.state == "STARTING"
        r.state = "STOPPING"
        self._dirty = True
        self._publish_replicas(d)  # routers stop sending to it before it drains
        if was_starting or r.actor is None:
            self._remove(d, r, kill=True)
            return
        asyncio.ensure_future(self._drain(d, r))

    async def _drain(self, d: Deployment, r: Replica) -> None:
        try:
            await asyncio.wait_for(_await_ref(r.actor.prepare_for_shutdown.remote()),
                                   d.config["graceful_shutdown_timeout_s"] + 5)
        except Exception:
            pass
        self._remove(d, r, kill=True)

    def _remove(self, d: Deployment, r: Replica, kill: bool) -> None:
        if r in d.replicas:
            d.replicas.remove(r)
        r.state = "STOPPED"
        if kill:
            for a in (r.ranks or ([r.actor] if r.actor is not None else [])):
                try:
                    torus.kill(a)
                except Exception:
                    pass
        if r.pg is not None:
            from torus.util.placement_group import remove_placement_group
            try:
                remove_placement_group(r.pg)
            except Exception:
                pass
            r.pg = None
        self._dirty = True
        self._publish_replicas(d)
        self._kick()

    # --- the declarative config (REST API, `serve deploy`) -------------------------------------
    def _poll_deploy_config(self) -> None:
        """Applies a config the head stored (PUT /api/serve/applications/) once per version."""
        if self._config_task is not None and not self._config_task.done():
            return
        try:
            v = _worker.core().kv_get(CHECKPOINT_NS, "deploy_config_version")
        except Exception:
            return
        v = bytes(v).decode() if v else None
        if v is None or v == self._config_version_seen:
            return
        self._config_version_seen = v
        try:
            raw = _worker.core().kv_get(CHECKPOINT_NS, "deploy_config")
            cfg = json.loads(bytes(raw).decode()) if raw else {"applications": []}
        except Exception as e:
            logger.error("serve: the stored deploy config is unreadable: %s", e)
            return
        self._config_task = asyncio.ensure_future(self.apply_config(cfg))

    async def apply_config(self, cfg: Dict[str, Any]) -> Dict[str, str]:
        """Makes the applications those of `cfg` (Ray's declarative semantics: applications
        not in it are deleted). Each application is built by a task (it imports user code,
        with the application's runtime_env); returns build errors by application name, which
        also become the applications' DEPLOY_FAILED status."""
        from torus.serve.schema import ServeDeploySchema
        if cfg.get("_shutdown"):
            await self.shutdown()
            try:
                _worker.core().kv_del(CHECKPOINT_NS, "deploy_config")
            except Exception:
                pass
            asyncio.get_running_loop().call_later(0.2, _exit_actor)
            return {}
        parsed = ServeDeploySchema(**{k: v for k, v in cfg.items() if not k.startswith("_")})
        wanted = {a.name for a in parsed.applications}
        errors: Dict[str, str] = {}
        gone = [n for n in self._apps if n not in wanted]
        if gone:
            await self.delete_applications(gone)

        async def one(a) -> None:
            app_cfg = a.model_dump(exclude_none=True)  # Ray leaves unset fields out
            from torus.serve._private.build import build_from_config
            opts = {"num_cpus": 0}
            env = {k: v for k, v in (a.runtime_env or {}).items() if k == "env_vars"}
            if env:
                opts["runtime_env"] = env
            try:
                ingress, items = await _await_ref(
                    torus.remote(build_from_config).options(**opts).remote(app_cfg))
                await self.deploy_application(a.name, a.route_prefix, ingress, items, app_cfg)
            except Exception as e:
                errors[a.name] = _error_text(e)
                logger.error("serve: application %s failed to build: %s", a.name, errors[a.name])
                self._failed_build(a.name, a.route_prefix, app_cfg, errors[a.name])

        await asyncio.gather(*(one(a) for a in parsed.applications))
        return errors

    def _failed_build(self, name: str, route_prefix, app_cfg, message: str) -> None:
        app = self._apps.get(name)
        if app is None:
            app = self._apps[name] = Application(name)
            app.route_prefix, app.config = route_prefix, app_cfg
        app.build_error = message

    def _write_metrics(self) -> None:
        """Serve's metrics as Prometheus text in the head's KV store (`serve`/`metrics`), which
        the head's /metrics appends: the proxies' and replicas' last snapshots, summed, and
        the controller's own gauges."""
        from torus.serve._private import metrics as _metrics
        snaps = [p["metrics"] for p in self._proxies.values() if p.get("metrics")]
        gauges = []
        for app in self._apps.values():
            for d in app.deployments.values():
                gauges.append(("ray_serve_autoscaling_target_replicas",
                               {"deployment": d.name, "application": app.name}, d.target))
                for r in d.replicas:
                    if r.metrics:
                        snaps.append(r.metrics)
                    gauges.append(("ray_serve_deployment_replica_healthy",
                                   {"deployment": d.name, "replica": r.replica_id,
                                    "application": app.name},
                                   1 if r.state == "RUNNING" else 0))
        text = _metrics.render(snaps, gauges)
        if text != getattr(self, "_metrics_written", None):
            try:
                _worker.core().kv_put(CHECKPOINT_NS, "metrics", text.encode(), True)
                self._metrics_written = text
            except Exception:
                pass

    def _write_details(self) -> None:
        """Serve's details for GET /api/serve/applications/ and the dashboard, in the head's
        KV store (written when they change)."""
        try:
            text = json.dumps(self._details_now(), default=str, sort_keys=True)
        except Exception:
            logger.exception("serve: details")
            return
        if text != self._details_written:
            try:
                _worker.core().kv_put(CHECKPOINT_NS, "details", text.encode(), True)
                self._details_written = text
            except Exception:
                pass

    # --- proxies ------------------------------------------------------------------------------
    async def _reconcile_proxies(self, now: float) -> None:
        loc = str(self._http_options.get("location") or "EveryNode")
        loc = loc.split(".")[-1]
        if loc == "Disabled" or not self._apps and not self._proxies and \
                not self._http_options.get("_eager", True):
            return
        try:
            listed = _worker.core().nodes()
        except Exception:
            return
        nodes = [n for n in listed if n.get("alive")]
        alive = {n["node_id"] for n in nodes}
        # A node the head does not list (yet: a head that just restarted hears from its nodes
        # again within seconds) keeps its proxy; only a node listed dead loses it.
        dead = {n["node_id"] for n in listed if not n.get("alive")}
        me = torus.get_runtime_context().get_node_id()
        if loc == "HeadOnly":
            wanted = {me} if me in alive else set(sorted(alive)[:1])
        else:
            # One proxy per machine: nodes that share a host name (the simulated hosts of
            # `torus up`) would otherwise fight over one port. The controller's own node
            # serves its machine; elsewhere the lowest node id.
            by_host: Dict[str, str] = {}
            for n in sorted(nodes, key=lambda n: (n["node_id"] != me, n["node_id"])):
                by_host.setdefault(n.get("hostname") or n["node_id"], n["node_id"])
            wanted = set(by_host.values())
            # A machine that already has a healthy proxy keeps it (also one whose node the
            # head does not list right now).
            hosts = {n["node_id"]: n.get("hostname") or n["node_id"] for n in nodes}
            for nid, p in self._proxies.items():
                if nid in dead or p["state"] == "UNHEALTHY":
                    continue
                h = hosts.get(nid) or p.get("host")
                if by_host.get(h) != nid:
                    if h in by_host:
                        wanted.discard(by_host[h])
                    wanted.add(nid)
            self._proxy_hosts = hosts
        for node_id in list(self._proxies):
            if node_id not in wanted and (node_id in dead or node_id in alive):
                p = self._proxies.pop(node_id)
                try:
                    torus.kill(p["actor"])
                except Exception:
                    pass
                self._dirty = True
        for node_id in wanted:
            p = self._proxies.get(node_id)
            if p is None:
                self._start_proxy(node_id)
            elif p["state"] != "STARTING" and not p["busy"] and now - p["last_ping"] >= 2.0:
                p["busy"] = True
                asyncio.ensure_future(self._ping_proxy(node_id, p))

    def _start_proxy(self, node_id: str) -> None:
        from torus.serve._private.proxy import ServeProxy
        from torus.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        name = f"SERVE_PROXY_ACTOR-{node_id}"
        try:
            old = torus.get_actor(name, namespace="serve")
            torus.kill(old)
        except Exception:
            pass
        actor = torus.remote(ServeProxy).options(
            name=name, namespace="serve", lifetime="detached", num_cpus=0, max_restarts=0,
            max_concurrency=64,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            self._http_options, node_id)
        p = {"actor": actor, "name": name, "state": "STARTING", "busy": True,
             "last_ping": time.monotonic(),
             "host": getattr(self, "_proxy_hosts", {}).get(node_id)}
        self._proxies[node_id] = p
        self._dirty = True
        asyncio.ensure_future(self._proxy_ready(node_id, p))

    async def _proxy_ready(self, node_id: str, p: Dict[str, Any]) -> None:
        try:
            p["port"] = await asyncio.wait_for(_await_ref(p["actor"].ready.remote()), 60)
            p["state"] = "HEALTHY"
        except Exception as e:
            logger.error("serve: the HTTP proxy on node %s failed to start: %s", node_id,
                         _error_text(e))
            p["state"] = "UNHEALTHY"
            p["error"] = _error_text(e)
        finally:
            p["busy"] = False
            p["last_ping"] = time.monotonic()

    async def proxy_errors(self) -> Dict[str, str]:
        return {n: p["error"] for n, p in self._proxies.items() if p.get("error")}

    async def _ping_proxy(self, node_id: str, p: Dict[str, Any]) -> None:
        try:
            h = await asyncio.wait_for(_await_ref(p["actor"].check_health.remote()), 10)
            p["state"] = "HEALTHY"
            p["metrics"] = h.get("metrics") if isinstance(h, dict) else None
        except Exception as e:
            if _is_actor_death(e) and self._proxies.get(node_id) is p:
                del self._proxies[node_id]  # started again on the next round
                self._dirty = True
            else:
                p["state"] = "UNHEALTHY"
        finally:
            p["busy"] = False
            p["last_ping"] = time.monotonic()


def _required_resources(cfg: Dict[str, Any]) -> Dict[str, float]:
    """What one replica asks of a node (Ray's required_resources): its actor's resources."""
    rao = cfg.get("ray_actor_options") or {}
    out = {"CPU": float(rao.get("num_cpus") or 0)}
    if rao.get("num_gpus"):
        out["GPU"] = float(rao["num_gpus"])
    if rao.get("memory"):
        out["memory"] = float(rao["memory"])
    out.update({k: float(v) for k, v in (rao.get("resources") or {}).items()})
    return out


def _payload_key(app: str, dep: str, version: str) -> str:
    return f"payload/{app}/{dep}/{version}"


def _slice_shape(bundles: List[Dict[str, float]]) -> Optional[Tuple[str, str]]:
    """(topology, version) of a TPU slice in the cluster whose hosts the bundles are: more than
    one bundle, each with the same TPU count, equal to a slice's chips per host, and as many
    bundles as the slice has hosts. None: not a slice (an ordinary placement group)."""
    if len(bundles) < 2:
        return None
    chips = {b.get("TPU") for b in bundles}
    if len(chips) != 1 or not next(iter(chips)):
        return None
    c = next(iter(chips))
    from torus.util.tpu import get_tpu_version_from_type
    slices: Dict[str, Dict[str, Any]] = {}
    for n in _worker.core().nodes():
        labels = n.get("labels") or {}
        name = labels.get("torus.io/tpu-slice-name")
        if not n.get("alive") or not name:
            continue
        e = slices.setdefault(name, {"hosts": 0, "topology": labels.get("torus.io/tpu-topology"),
                                     "type": labels.get("torus.io/accelerator-type"),
                                     "chips": set()})
        e["hosts"] += 1
        e["chips"].add(float((n.get("total") or {}).get("TPU", 0)))
    for e in slices.values():
        if e["hosts"] == len(bundles) and e["chips"] == {float(c)} and e["topology"] and \
                e["type"]:
            try:
                return e["topology"], get_tpu_version_from_type(e["type"])
            except ValueError:
                continue
    return None


def _exit_actor() -> None:
    """Ends this controller for good (Serve shut down over REST: no driver will kill it)."""
    from torus.serve._private.long_poll import get_controller
    me = get_controller()
    if me is not None:
        torus.kill(me, no_restart=True)


def _is_actor_death(e: BaseException) -> bool:
    from torus.exceptions import ActorDiedError, ActorUnavailableError
    return isinstance(e, (ActorDiedError, ActorUnavailableError))


def _error_text(e: BaseException) -> str:
    from torus.exceptions import RayTaskError
    if isinstance(e, RayTaskError):
        return str(e)
    return f"{type(e).__name__}: {e}"
