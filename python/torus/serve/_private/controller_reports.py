"""What the controller tells the outside: `serve.status()`, the details for the REST API and the
dashboard (KV `serve`/`details`), Serve's metrics (KV `serve`/`metrics`), and the declarative
config the head stores for `PUT /api/serve/applications/` (KV `serve`/`deploy_config`, applied
once per version). Runs on the controller's event loop (a mixin of ServeController)."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Dict

import torus
from torus._private import worker as _worker
from torus.serve._private.controller_model import (CHECKPOINT_NS, Application, Deployment,
                                                   _error_text, _required_resources)
from torus.serve.handle import _await_ref

logger = logging.getLogger("torus.serve")


class ReportsMixin:
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
        elif self._no_proxy_listening(app):
            # Reported RUNNING only once it can be reached over HTTP: a deploy through the REST
            # API or `serve deploy` (and KubeRay, which routes traffic on RUNNING) would
            # otherwise see a refused connection right after RUNNING.
            status, msg = "DEPLOYING", "waiting for the HTTP proxy to listen"
        elif any(x["status"] == "UNHEALTHY" for x in deps.values()):
            status = "UNHEALTHY"
            msg = "; ".join(f"Deployment '{n}': {x['message']}" for n, x in deps.items()
                            if x["status"] == "UNHEALTHY")
        else:
            status, msg = "RUNNING", ""
        return {"status": status, "message": msg, "last_deployed_time_s": app.deployed_at,
                "deployments": deps}

    def _no_proxy_listening(self, app: Application) -> bool:
        loc = str(self._http_options.get("location") or "EveryNode").split(".")[-1]
        if app.route_prefix is None or loc == "Disabled":
            return False
        return not any(p["state"] == "HEALTHY" for p in self._proxies.values())

    @staticmethod
    def _replica_counts(d: Deployment) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for r in d.replicas:
            out[r.state] = out.get(r.state, 0) + 1
        return out

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
        KV store (written when they change; not while shutting down, which removes them)."""
        if self._shutting_down:
            return
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
        from torus._private import runtime_env as _renv
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
            from torus.serve._private.app_builder import build_from_config
            opts = {"num_cpus": 0}
            try:
                # Local working_dir / py_modules are packed here, once: the build task and every
                # replica get their URIs (a path must exist on the controller's machine).
                env = await asyncio.get_running_loop().run_in_executor(
                    None, _renv.with_uris, a.runtime_env, f"application '{a.name}'")
                if env:
                    opts["runtime_env"] = env
                    app_cfg["runtime_env"] = env
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


def _exit_actor() -> None:
    """Ends this controller for good (Serve shut down over REST: no driver will kill it)."""
    from torus.serve._private.long_poll import get_controller
    me = get_controller()
    if me is not None:
        torus.kill(me, no_restart=True)
