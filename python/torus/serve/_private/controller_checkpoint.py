"""The controller's durability: its state written to the head's KV store (`serve`/`checkpoint`,
and each version's code and arguments once under `serve`/`payload/...`) and read back by a
restarted controller, which finds its replicas and proxies again by their actor names.
Runs on the controller's event loop (a mixin of ServeController)."""
from __future__ import annotations

import logging
import pickle
import time

import torus
from torus._private import worker as _worker
from torus.serve._private.autoscaling import AutoscalingState
from torus.serve._private.controller_model import (CHECKPOINT_KEY, CHECKPOINT_NS, Application,
                                                   Deployment, Replica, _payload_key)

logger = logging.getLogger("torus.serve")


class CheckpointMixin:
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

    @staticmethod
    def _drop_payload(app: str, dep: str, version: str) -> None:
        try:
            _worker.core().kv_del(CHECKPOINT_NS, _payload_key(app, dep, version))
        except Exception:
            pass
