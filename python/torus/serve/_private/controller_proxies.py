"""The controller's HTTP proxies: one per machine (or on its own node for HeadOnly), started,
pinged, and replaced when dead; a node the head does not list keeps its proxy. Runs on the
controller's event loop (a mixin of ServeController)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Dict

import torus
from torus._private import worker as _worker
from torus.serve._private.controller_model import (_error_text, _is_actor_death)
from torus.serve.handle import _await_ref

logger = logging.getLogger("torus.serve")


class ProxiesMixin:
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
            self._kick()  # applications waiting for a listening proxy are RUNNING now
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

    async def proxy_ports(self) -> Dict[str, Any]:
        return {n: p.get("port") for n, p in self._proxies.items()}
