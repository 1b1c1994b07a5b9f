"""What `serve.status()` returns (Ray 2.60's classes and status names), and Serve's config file
format (`serve deploy`, the REST API): applications with `import_path`, `route_prefix`,
`runtime_env`, `args` and `deployments` overrides."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field


class ApplicationStatus(str, enum.Enum):
    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class DeploymentStatus(str, enum.Enum):
    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"


class DeploymentStatusTrigger(str, enum.Enum):
    UNSPECIFIED = "UNSPECIFIED"
    CONFIG_UPDATE_STARTED = "CONFIG_UPDATE_STARTED"
    CONFIG_UPDATE_COMPLETED = "CONFIG_UPDATE_COMPLETED"
    UPSCALE_COMPLETED = "UPSCALE_COMPLETED"
    DOWNSCALE_COMPLETED = "DOWNSCALE_COMPLETED"
    AUTOSCALING = "AUTOSCALING"
    REPLICA_STARTUP_FAILED = "REPLICA_STARTUP_FAILED"
    DEPLOYMENT_ACTOR_FAILED = "DEPLOYMENT_ACTOR_FAILED"
    HEALTH_CHECK_FAILED = "HEALTH_CHECK_FAILED"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    DELETING = "DELETING"


class ReplicaState(str, enum.Enum):
    STARTING = "STARTING"
    UPDATING = "UPDATING"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


class ProxyStatus(str, enum.Enum):
    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"


@dataclass(eq=True)
class DeploymentStatusOverview:
    status: DeploymentStatus
    status_trigger: DeploymentStatusTrigger
    replica_states: Dict[ReplicaState, int]
    message: str


@dataclass(eq=True)
class ApplicationStatusOverview:
    status: ApplicationStatus
    message: str
    last_deployed_time_s: float
    deployments: Dict[str, DeploymentStatusOverview]


@dataclass(eq=True)
class ServeStatus:
    proxies: Dict[str, ProxyStatus] = field(default_factory=dict)
    applications: Dict[str, ApplicationStatusOverview] = field(default_factory=dict)
    target_capacity: Optional[float] = None


def status_from_controller(raw: Dict[str, Any]) -> ServeStatus:
    apps = {}
    for name, a in raw["applications"].items():
        deps = {d: DeploymentStatusOverview(
            status=DeploymentStatus(x["status"]),
            status_trigger=DeploymentStatusTrigger(x["status_trigger"]),
            replica_states={ReplicaState(k): v for k, v in x["replica_states"].items()
                            if k in ReplicaState.__members__},
            message=x["message"]) for d, x in a["deployments"].items()}
        apps[name] = ApplicationStatusOverview(
            status=ApplicationStatus(a["status"]), message=a["message"],
            last_deployed_time_s=a["last_deployed_time_s"], deployments=deps)
    return ServeStatus(proxies={n: ProxyStatus(s) for n, s in raw["proxies"].items()},
                       applications=apps)


# --- the config file ---------------------------------------------------------------------------
class DeploymentSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    num_replicas: Optional[Any] = None
    max_ongoing_requests: Optional[int] = None
    max_queued_requests: Optional[int] = None
    user_config: Optional[Any] = None
    autoscaling_config: Optional[Dict[str, Any]] = None
    graceful_shutdown_wait_loop_s: Optional[float] = None
    graceful_shutdown_timeout_s: Optional[float] = None
    health_check_period_s: Optional[float] = None
    health_check_timeout_s: Optional[float] = None
    ray_actor_options: Optional[Dict[str, Any]] = None
    placement_group_bundles: Optional[List[Dict[str, float]]] = None
    placement_group_strategy: Optional[str] = None
    max_replicas_per_node: Optional[int] = None
    logging_config: Optional[Dict[str, Any]] = None
    version: Optional[str] = None


class ServeApplicationSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "default"
    route_prefix: Optional[str] = "/"
    import_path: str
    runtime_env: Dict[str, Any] = Field(default_factory=dict)
    host: Optional[str] = None
    port: Optional[int] = None
    deployments: List[DeploymentSchema] = Field(default_factory=list)
    args: Dict[str, Any] = Field(default_factory=dict)
    logging_config: Optional[Dict[str, Any]] = None
    external_scaler_enabled: bool = False


class HTTPOptionsSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    host: Optional[str] = None
    port: Optional[int] = None
    root_path: Optional[str] = None
    request_timeout_s: Optional[float] = None
    keep_alive_timeout_s: Optional[int] = None


class ServeDeploySchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    proxy_location: Optional[str] = "EveryNode"
    http_options: Optional[HTTPOptionsSchema] = None
    grpc_options: Optional[Dict[str, Any]] = None
    logging_config: Optional[Dict[str, Any]] = None
    applications: List[ServeApplicationSchema] = Field(default_factory=list)
    target_capacity: Optional[float] = None
