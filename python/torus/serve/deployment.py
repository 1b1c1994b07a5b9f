"""`@serve.deployment`, `Deployment` and `Application` (a bound graph of deployments).

A `Deployment` is a class or function with its options; `.bind(*args)` makes an `Application`
whose arguments may themselves be Applications (the deployments it calls). `build_app` walks
that graph once, at `serve.run`: every bound deployment becomes one deployment of the
application (a name used twice gets `_1`, `_2`, ... as in Ray), and an Application argument
becomes a `DeploymentHandle` to that deployment. Immutable values; no threads.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple, Union


# Options `@serve.deployment` and `.options()` take (Ray 2.60's names).
DEPLOYMENT_OPTIONS = (
    "name", "version", "num_replicas", "ray_actor_options", "placement_group_bundles",
    "placement_group_strategy", "placement_group_bundle_label_selector", "max_replicas_per_node",
    "user_config", "max_ongoing_requests", "max_queued_requests", "autoscaling_config",
    "graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s", "health_check_period_s",
    "health_check_timeout_s", "logging_config", "request_router_config",
    "max_constructor_retry_count", "backpressure_config", "rolling_update_percentage",
    "max_surge_percent",
)
# Accepted and kept, with no effect here (logging and routing policy plug-ins).
_NO_EFFECT = ("logging_config", "request_router_config", "backpressure_config",
              "rolling_update_percentage", "max_surge_percent",
              "placement_group_bundle_label_selector")


class Deployment:
    """A class or function to serve, with its options."""

    def __init__(self, func_or_class: Union[Callable, type], name: str,
                 options: Dict[str, Any]):
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty string")
        if "#" in name:
            raise ValueError(f"Deployment names must not contain the '#' character, got "
                             f"'{name}'.")
        self._func_or_class = func_or_class
        self._name = name
        self._options = dict(options)
        from torus.serve import config as _config  # (pydantic: loaded where options are)
        _config.deployment_config(self._options)  # checks the options now, as Ray does

    # --- Ray's read-only properties --------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> Optional[str]:
        return self._options.get("version")

    @property
    def func_or_class(self):
        return self._func_or_class

    @property
    def num_replicas(self):
        return self._options.get("num_replicas", 1)

    @property
    def user_config(self):
        return self._options.get("user_config")

    @property
    def max_ongoing_requests(self) -> int:
        from torus.serve.config import DEFAULT_MAX_ONGOING_REQUESTS
        return self._options.get("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)

    @property
    def max_queued_requests(self) -> int:
        return self._options.get("max_queued_requests", -1)

    @property
    def ray_actor_options(self) -> Optional[Dict]:
        return self._options.get("ray_actor_options")

    @property
    def autoscaling_config(self):
        return self._options.get("autoscaling_config")

    def options(self, **kwargs) -> "Deployment":
        _check_option_names(kwargs)
        opts = dict(self._options)
        name = kwargs.pop("name", self._name)
        if "num_replicas" in kwargs and "autoscaling_config" not in kwargs and \
                kwargs["num_replicas"] is not None:
            opts.pop("autoscaling_config", None)
        if kwargs.get("autoscaling_config") is not None and "num_replicas" not in kwargs:
            opts.pop("num_replicas", None)
        opts.update(kwargs)
        return Deployment(self._func_or_class, name, opts)

    def bind(self, *args, **kwargs) -> "Application":
        return Application(self, args, kwargs)

    def __call__(self, *a, **k):
        raise RuntimeError("Deployments cannot be constructed directly. Use `.bind()` instead.")

    def __repr__(self):
        return f"Deployment(name={self._name})"


class Application:
    """One bound deployment and its arguments: the root (ingress) of an application's graph."""

    def __init__(self, deployment: Deployment, args: Tuple, kwargs: Dict):
        self._deployment = deployment
        self._args = args
        self._kwargs = kwargs

    @property
    def _bound_deployment(self) -> Deployment:
        return self._deployment

    def __repr__(self):
        return f"Application({self._deployment.name})"


def _check_option_names(kwargs: Dict[str, Any]) -> None:
    for k in kwargs:
        if k not in DEPLOYMENT_OPTIONS:
            raise TypeError(f"deployment() got an unexpected keyword argument '{k}'")


def deployment(_func_or_class=None, **kwargs):
    """`@serve.deployment` / `@serve.deployment(**options)` on a class or a function."""
    _check_option_names(kwargs)

    def make(target):
        if not (inspect.isclass(target) or inspect.isfunction(target) or callable(target)):
            raise TypeError("@serve.deployment must be applied to a class or a function.")
        name = kwargs.get("name") or getattr(target, "__name__", None) or type(target).__name__
        opts = {k: v for k, v in kwargs.items() if k != "name"}
        return Deployment(target, name, opts)

    if _func_or_class is not None:
        if kwargs or not callable(_func_or_class):
            raise TypeError("@serve.deployment takes keyword options only")
        return make(_func_or_class)
    return make


class BuiltDeployment:
    """One deployment of a built application: what the controller is sent."""

    def __init__(self, name: str, func_or_class, args, kwargs, options):
        self.name = name
        self.func_or_class = func_or_class
        self.args = args
        self.kwargs = kwargs
        self.options = options


def build_app(app: Application, app_name: str) -> Tuple[List[BuiltDeployment], str]:
    """The deployments of `app`'s graph (handles in place of bound arguments) and the name of
    its ingress (the root)."""
    if not isinstance(app, Application):
        raise TypeError(f"Expected an Application (the result of `.bind()`), got "
                        f"{type(app).__name__}. Did you forget to call `.bind()`?")
    from torus.serve.handle import DeploymentHandle

    out: List[BuiltDeployment] = []
    names: Dict[int, str] = {}  # id(Application) -> deployment name
    taken: Dict[str, int] = {}

    def visit(node: Application) -> str:
        if id(node) in names:
            return names[id(node)]
        base = node._deployment.name
        n = taken.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        taken[base] = n + 1
        names[id(node)] = name

        def sub(v):
            if isinstance(v, Application):
                return DeploymentHandle(visit(v), app_name)
            if isinstance(v, list):
                return [sub(x) for x in v]
            if isinstance(v, tuple):
                return tuple(sub(x) for x in v)
            if isinstance(v, dict):
                return {k: sub(x) for k, x in v.items()}
            return v

        args = tuple(sub(a) for a in node._args)
        kwargs = {k: sub(v) for k, v in node._kwargs.items()}
        out.append(BuiltDeployment(name, node._deployment.func_or_class, args, kwargs,
                                   node._deployment._options))
        return name

    ingress = visit(app)
    return out, ingress
