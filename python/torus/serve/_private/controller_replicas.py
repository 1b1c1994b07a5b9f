"""The controller's replicas: each deployment's reconciliation (targets, rollouts, scaling,
status), replica start (one actor, or one per host of a TPU slice), initialization, pings and
health checks, reconfiguration, draining and removal. Runs on the controller's event loop (a
mixin of ServeController)."""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torus
from torus._private import worker as _worker
from torus.serve._private.controller_model import (PING_PERIOD_S, Deployment, Replica, _error_text,
                                                   _is_actor_death)
from torus.serve.handle import _await_ref

logger = logging.getLogger("torus.serve")


class ReplicasMixin:
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

    def _node_below_cap(self, d: Deployment, rao: Dict[str, Any]) -> Optional[str]:
        """For `max_replicas_per_node`: the live node with the fewest of `d`'s replicas, below
        the cap, whose resources could hold one (a replica waits, pending, when none is)."""
        cap = d.config["max_replicas_per_node"]
        counts: Dict[str, int] = {}
        for r in self._active(d):
            if r.node_id:
                counts[r.node_id] = counts.get(r.node_id, 0) + 1
        need = dict(rao.get("resources") or {})
        for key, res in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
            if rao.get(key):
                need[res] = rao[key]
        best = None
        cached = getattr(self, "_nodes_seen", None)
        if cached is None or time.monotonic() - cached[0] > 1.0:  # one head call a second
            try:
                cached = self._nodes_seen = (time.monotonic(), torus.nodes())
            except Exception as e:  # the head is away: try again next round
                logger.warning("serve: cannot list the nodes for max_replicas_per_node: %s", e)
                return None
        for n in cached[1]:
            nid, total = n.get("NodeID"), n.get("Resources") or {}
            if not n.get("Alive") or counts.get(nid, 0) >= cap:
                continue
            if any(total.get(k, 0) < v for k, v in need.items()):
                continue
            if best is None or counts.get(nid, 0) < counts.get(best, 0):
                best = nid
        return best

    def _start(self, d: Deployment) -> None:
        from torus.serve._private.replica import ServeReplica
        from torus.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                                      PlacementGroupSchedulingStrategy)
        cfg = d.config
        rao = dict(cfg.get("ray_actor_options") or {})
        node = None
        if cfg.get("max_replicas_per_node"):
            node = self._node_below_cap(d, rao)
            old = [r for r in self._active(d) if r.version != d.version and r.node_id]
            if node is None and old:
                # A rollout with every node at the cap: an old replica makes room first (as
                # Ray stops old replicas before it starts new ones).
                self._stop(d, sorted(old, key=lambda r: r.state != "STARTING")[0])
                return
            if node is None:
                msg = (f"A replica cannot be placed: every node that could hold one has "
                       f"max_replicas_per_node={cfg['max_replicas_per_node']} of them.")
                if d.message != msg:
                    logger.warning("serve: deployment %s: %s", d.name, msg)
                    d.message = msg
                return
        rid = uuid.uuid4().hex[:8]
        r = Replica(rid, d.version, d.config_version)
        r.actor_name = f"SERVE_REPLICA::{d.app}#{d.name}#{rid}"
        d.replicas.append(r)
        opts = {"name": r.actor_name, "namespace": "serve", "lifetime": "detached",
                "max_restarts": 0,
                "max_concurrency": max(100, cfg["max_ongoing_requests"] * 4 + 16)}
        for k in ("num_cpus", "num_gpus", "memory", "resources", "runtime_env",
                  "label_selector", "scheduling_strategy", "accelerator_type"):
            if rao.get(k) is not None:
                opts[k] = rao[k]
        if node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
            r.node_id = node  # counted against the cap while it starts
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
