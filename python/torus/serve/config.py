"""Serve's configuration objects, with Ray 2.60's names, fields and defaults.

`AutoscalingConfig` and `HTTPOptions` are pydantic models, as in Ray, so a dict with the same keys
(from a decorator, `.options(...)` or a Serve config file) validates the same way.
`DeploymentConfig` is what the controller keeps of a deployment's options; it is plain data
(a dict once serialized) and needs no lock: it is built once and never changed in place.
"""
from __future__ import annotations

import enum
from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, \
    PositiveFloat, PositiveInt, model_validator

DEFAULT_HTTP_PORT = 8000
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_MAX_ONGOING_REQUESTS = 5
DEFAULT_TARGET_ONGOING_REQUESTS = 2.0
DEFAULT_HEALTH_CHECK_PERIOD_S = 10.0
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 30.0
DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2.0
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0


class ProxyLocation(str, enum.Enum):
    """Where HTTP proxies run: none, on the head node only, or on every node."""
    Disabled = "Disabled"
    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"


class AutoscalingConfig(BaseModel):
    """Ray's autoscaling knobs: replicas follow ongoing requests per replica."""
    model_config = ConfigDict(extra="forbid")

    min_replicas: NonNegativeInt = 1
    initial_replicas: Optional[NonNegativeInt] = None
    max_replicas: PositiveInt = 1
    target_ongoing_requests: Optional[PositiveFloat] = DEFAULT_TARGET_ONGOING_REQUESTS
    metrics_interval_s: PositiveFloat = 10.0
    look_back_period_s: PositiveFloat = 30.0
    smoothing_factor: PositiveFloat = 1.0
    upscale_smoothing_factor: Optional[PositiveFloat] = None
    downscale_smoothing_factor: Optional[PositiveFloat] = None
    upscaling_factor: Optional[PositiveFloat] = None
    downscaling_factor: Optional[PositiveFloat] = None
    downscale_delay_s: NonNegativeFloat = 600.0
    downscale_to_zero_delay_s: Optional[NonNegativeFloat] = None
    upscale_delay_s: NonNegativeFloat = 30.0
    aggregation_function: str = "mean"

    @model_validator(mode="after")
    def _check(self):
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be greater than or equal to min_replicas.")
        if self.initial_replicas is not None:
            if not self.min_replicas <= self.initial_replicas <= self.max_replicas:
                raise ValueError("initial_replicas must be between min_replicas and "
                                 "max_replicas.")
        if self.aggregation_function not in ("mean", "max", "min"):
            raise ValueError(f"aggregation_function must be mean, max or min, got "
                             f"{self.aggregation_function!r}")
        return self

    @classmethod
    def default(cls) -> "AutoscalingConfig":
        """What `num_replicas="auto"` means (Ray's defaults for it)."""
        return cls(min_replicas=1, max_replicas=100, target_ongoing_requests=2.0)

    def get_upscaling_factor(self) -> float:
        return self.upscaling_factor or self.upscale_smoothing_factor or self.smoothing_factor

    def get_downscaling_factor(self) -> float:
        return (self.downscaling_factor or self.downscale_smoothing_factor
                or self.smoothing_factor)


class HTTPOptions(BaseModel):
    """Where and how the HTTP proxies listen."""
    model_config = ConfigDict(extra="forbid")

    host: Optional[str] = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    middlewares: List[Any] = Field(default_factory=list)
    location: Optional[ProxyLocation] = ProxyLocation.EveryNode
    num_cpus: int = 0
    root_url: str = ""
    root_path: str = ""
    request_timeout_s: Optional[float] = None
    keep_alive_timeout_s: int = 90
    ssl_keyfile: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile_password: Optional[str] = None
    ssl_ca_certs: Optional[str] = None


class gRPCOptions(BaseModel):
    """Accepted for API compatibility; Torus's Serve has no gRPC proxy (a port of 0 or no
    servicer functions means none is wanted, which is what is checked)."""
    port: int = 9000
    grpc_servicer_functions: List[str] = Field(default_factory=list)


def _max_replicas_per_node(v, pg_bundles) -> Optional[int]:
    """Ray's rules: None or an int in [1, 100], and never with placement_group_bundles."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"Get invalid type '{type(v)}' for max_replicas_per_node. Expected None "
                        "or an integer in the range of [1, 100].")
    if not 1 <= v <= 100:
        raise ValueError(f"Invalid max_replicas_per_node {v}. Valid values are None or an "
                         "integer in the range of [1, 100].")
    if pg_bundles is not None:
        raise ValueError("Setting max_replicas_per_node is not allowed when "
                         "placement_group_bundles is provided.")
    return v


# Options of a deployment that a new value of changes how replicas run, not what they run:
# these never restart a replica.
LIGHTWEIGHT_OPTIONS = ("num_replicas", "autoscaling_config", "user_config",
                       "max_ongoing_requests", "max_queued_requests", "graceful_shutdown_timeout_s",
                       "graceful_shutdown_wait_loop_s", "health_check_period_s",
                       "health_check_timeout_s")


def autoscaling_from(value: Union[None, dict, AutoscalingConfig]) -> Optional[AutoscalingConfig]:
    if value is None:
        return None
    if isinstance(value, AutoscalingConfig):
        return value
    if isinstance(value, dict):
        return AutoscalingConfig(**value)
    raise TypeError(f"autoscaling_config must be a dict or AutoscalingConfig, got "
                    f"{type(value).__name__}")


def http_options_from(value: Union[None, dict, HTTPOptions]) -> HTTPOptions:
    if value is None:
        return HTTPOptions()
    if isinstance(value, HTTPOptions):
        return value
    if isinstance(value, dict):
        return HTTPOptions(**value)
    raise TypeError(f"http_options must be a dict or HTTPOptions, got {type(value).__name__}")


def deployment_config(opts: Dict[str, Any]) -> Dict[str, Any]:
    """The controller's view of a deployment's options: every knob with its default filled in,
    checked. `opts` are the options the user gave (decorator, .options(), config file)."""
    num = opts.get("num_replicas")
    auto = autoscaling_from(opts.get("autoscaling_config"))
    if num == "auto":
        base = AutoscalingConfig.default().model_dump()
        if auto is not None:
            base.update(auto.model_dump(exclude_unset=True))
        auto, num = AutoscalingConfig(**base), None
    if num is not None and auto is not None:
        raise ValueError("Manually setting num_replicas is not allowed when autoscaling_config "
                         "is provided.")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < 0):
        raise ValueError(f"num_replicas must be a non-negative integer or \"auto\", got {num!r}")
    mor = opts.get("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)
    if isinstance(mor, bool) or not isinstance(mor, int) or mor <= 0:
        raise ValueError(f"max_ongoing_requests must be a positive integer, got {mor!r}")
    mqr = opts.get("max_queued_requests", -1)
    if isinstance(mqr, bool) or not isinstance(mqr, int) or (mqr < 0 and mqr != -1):
        raise ValueError(f"max_queued_requests must be -1 (no limit) or a non-negative "
                         f"integer, got {mqr!r}")
    pg_bundles = opts.get("placement_group_bundles")
    pg_strategy = opts.get("placement_group_strategy")
    if pg_strategy is not None and pg_bundles is None:
        raise ValueError("If `placement_group_strategy` is provided, `placement_group_bundles` "
                         "must also be provided.")
    if pg_bundles is not None:
        if not isinstance(pg_bundles, list) or not pg_bundles or \
                not all(isinstance(b, dict) for b in pg_bundles):
            raise ValueError("placement_group_bundles must be a non-empty list of dicts")
    rao = dict(opts.get("ray_actor_options") or {})
    for k in rao:
        if k not in ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type",
                     "runtime_env", "label_selector", "scheduling_strategy", "object_store_memory"):
            raise ValueError(f"Got invalid key '{k}' in ray_actor_options.")
    if rao.get("num_cpus") is None:
        rao["num_cpus"] = 1
    if pg_bundles:
        # Ray's rule: the replica runs in the first bundle, so what it asks must fit there.
        first = pg_bundles[0]
        prefix = ("When `placement_group_bundles` is specified, the replica actor will be "
                  "placed in the first bundle, so the resource requirements for the actor "
                  "must be a subset of the first bundle.")
        for key, res in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if first.get(res, 0) < (rao.get(key) or 0):
                raise ValueError(f"{prefix} `{key}` for the actor is {rao.get(key)}, but the "
                                 f"bundle only has {first.get(res, 0)} `{res}` specified.")
        for res, amount in (rao.get("resources") or {}).items():
            if first.get(res, 0) < amount:
                raise ValueError(f"{prefix} `{res}` for the actor is {amount}, but the bundle "
                                 f"only has {first.get(res, 0)} `{res}` specified.")
    out = {
        "num_replicas": 1 if num is None and auto is None else num,
        "autoscaling_config": auto.model_dump() if auto is not None else None,
        "max_ongoing_requests": mor,
        "max_queued_requests": mqr,
        "user_config": opts.get("user_config"),
        "health_check_period_s": float(opts.get("health_check_period_s",
                                                DEFAULT_HEALTH_CHECK_PERIOD_S)),
        "health_check_timeout_s": float(opts.get("health_check_timeout_s",
                                                 DEFAULT_HEALTH_CHECK_TIMEOUT_S)),
        "graceful_shutdown_wait_loop_s": float(opts.get("graceful_shutdown_wait_loop_s",
                                                        DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S)),
        "graceful_shutdown_timeout_s": float(opts.get("graceful_shutdown_timeout_s",
                                                      DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S)),
        "ray_actor_options": rao,
        "placement_group_bundles": pg_bundles,
        "placement_group_strategy": pg_strategy or ("PACK" if pg_bundles else None),
        "version": opts.get("version"),
        "max_replicas_per_node": _max_replicas_per_node(opts.get("max_replicas_per_node"),
                                                        pg_bundles),
    }
    for k in ("health_check_period_s", "health_check_timeout_s", "graceful_shutdown_timeout_s"):
        if out[k] <= 0:
            raise ValueError(f"{k} must be positive, got {out[k]}")
    if out["graceful_shutdown_wait_loop_s"] < 0:
        raise ValueError("graceful_shutdown_wait_loop_s must be non-negative")
    return out
