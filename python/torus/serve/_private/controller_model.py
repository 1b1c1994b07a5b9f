"""The Serve controller's records (applications, deployments, replicas) and the helpers its
parts share. Plain data, touched only on the controller's event loop."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Optional

from torus.serve._private.autoscaling import AutoscalingState

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


def _is_actor_death(e: BaseException) -> bool:
    from torus.exceptions import ActorDiedError, ActorUnavailableError
    return isinstance(e, (ActorDiedError, ActorUnavailableError))


def _error_text(e: BaseException) -> str:
    from torus.exceptions import RayTaskError
    if isinstance(e, RayTaskError):
        return str(e)
    return f"{type(e).__name__}: {e}"
