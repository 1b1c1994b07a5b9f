"""Serve's driver-side API: `start`, `run`, `delete`, `shutdown`, `status`, and the handles.

Each call talks to the controller actor (started by `start`, or by `run` when none runs) and
waits, with a deadline, for what it asked to be true (an application RUNNING, deleted, ...).
`torus.init()` is called first when the program has not connected, as Ray's `serve.start`
does. Blocking calls; safe from any thread of a driver.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Dict, Optional, Union

from torus.serve._private.app_builder import packed_runtime_env
from torus.serve._private.payload import dumps as _payload_dumps

import torus
from torus.serve import config as _config
from torus.serve._private import router as _router
from torus.serve._private.long_poll import CONTROLLER_NAME, SERVE_NAMESPACE, get_controller
from torus.serve.deployment import Application, build_app
from torus.exceptions import RayTaskError
from torus.serve.exceptions import RayServeException
from torus.serve.handle import DeploymentHandle

logger = logging.getLogger("torus.serve")

_DEPLOY_TIMEOUT_S = float(os.environ.get("TORUS_SERVE_DEPLOY_TIMEOUT_S", "600"))


def _ensure_connected() -> None:
    if not torus.is_initialized():
        torus.init()


def _controller_or_raise():
    c = get_controller()
    if c is None:
        raise RayServeException("There is no Serve instance running on this Ray cluster. "
                                "Please call `serve.start()` or `serve.run()` first.")
    return c


def start(http_options: Union[None, dict, _config.HTTPOptions] = None,
          proxy_location: Union[None, str, _config.ProxyLocation] = None,
          grpc_options=None, logging_config=None, detached: bool = True,
          _wait_for_proxies: bool = True, **kwargs):
    """Starts Serve on the cluster (the controller and, on the first application, the HTTP
    proxies); a no-op (with a warning if the options differ) when Serve already runs."""
    _ensure_connected()
    opts = _config.http_options_from(http_options)
    if kwargs.get("http_host") is not None:
        opts.host = kwargs["http_host"]
    if kwargs.get("http_port") is not None:
        opts.port = int(kwargs["http_port"])
    if proxy_location is not None:
        opts.location = _config.ProxyLocation(proxy_location if isinstance(proxy_location, str)
                                              else proxy_location.value)
    if grpc_options:
        ports = grpc_options.get("grpc_servicer_functions") if isinstance(grpc_options, dict) \
            else getattr(grpc_options, "grpc_servicer_functions", None)
        if ports:
            raise NotImplementedError("Serve's gRPC proxy is not implemented by Torus")
    wanted = opts.model_dump(mode="json")
    wanted["middlewares"] = []
    c = get_controller()
    if c is not None:
        current = torus.get(c.get_http_options.remote())
        if {k: current.get(k) for k in ("host", "port", "location")} != \
                {k: wanted.get(k) for k in ("host", "port", "location")}:
            logger.warning("The new client HTTP config differs from the existing one in the "
                           "following fields: host/port/location. The new HTTP config is "
                           "ignored.")
        return
    from torus.serve._private.controller import ServeController
    c = torus.remote(ServeController).options(
        name=CONTROLLER_NAME, namespace=SERVE_NAMESPACE, lifetime="detached", num_cpus=0,
        max_restarts=-1, max_concurrency=10000, get_if_exists=True).remote(wanted)
    torus.get(c.ready.remote())
    if _wait_for_proxies:
        _wait_proxies(c)


def _wait_proxies(c, timeout_s: float = 60.0) -> None:
    """Waits until the proxies answer (or one failed to start: raised with its reason)."""
    if str(torus.get(c.get_http_options.remote()).get("location")).endswith("Disabled"):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = torus.get(c.status.remote())
        errs = torus.get(c.proxy_errors.remote())
        if errs:
            raise RuntimeError("; ".join(errs.values()))
        if st["proxies"] and all(s == "HEALTHY" for s in st["proxies"].values()):
            return
        time.sleep(0.02)


def _payload(d) -> bytes:
    return _payload_dumps((d.func_or_class, d.args, d.kwargs))


def _code_version(d, payload: bytes, opts: dict) -> str:
    """A deployment's code version when the user gave none: its pickled code and arguments, the
    source of the module that defines it (a class imported from a module is pickled by name, so
    an edited module must change the version too) and the options that need new replicas.
    Redeploying the same code with another user_config (or replica count, ...) keeps the
    replicas and reconfigures them, as Ray's documentation describes; Ray itself versions each
    `serve.run` at random and replaces them all."""
    import hashlib
    import inspect
    import json
    h = hashlib.sha1(payload)
    try:
        src = inspect.getsourcefile(d.func_or_class)
        if src:
            with open(src, "rb") as f:
                h.update(f.read())
    except (TypeError, OSError):
        h.update(os.urandom(8))  # no source to compare: treat as new code
    heavy = {k: v for k, v in opts.items() if k not in _config.LIGHTWEIGHT_OPTIONS}
    h.update(json.dumps(heavy, sort_keys=True, default=repr).encode())
    return h.hexdigest()[:16]


def _check_route_prefix(route_prefix) -> None:
    if route_prefix is None:
        return
    if not isinstance(route_prefix, str) or not route_prefix.startswith("/"):
        raise ValueError(f"The route_prefix must start with a forward slash ('/'), got "
                         f"{route_prefix!r}")
    if route_prefix != "/" and route_prefix.endswith("/"):
        raise ValueError(f"The route_prefix cannot end with a forward slash ('/'), got "
                         f"{route_prefix!r}")
    if "{" in route_prefix or "}" in route_prefix:
        raise ValueError(f"The route_prefix cannot contain wildcards ('{{' and '}}'), got "
                         f"{route_prefix!r}")


def deploy_app(target: Application, name: str, route_prefix: Optional[str],
               config: Optional[dict] = None, overrides: Optional[Dict[str, dict]] = None,
               wait: bool = True) -> DeploymentHandle:
    """Builds `target` and hands it to the controller; waits for it to run (RUNNING), raising
    the deployment's error if it failed."""
    _check_route_prefix(route_prefix)
    deployments, ingress = build_app(target, name)
    items = []
    for d in deployments:
        opts = dict(d.options)
        if overrides and d.name in overrides:
            ov = overrides[d.name]
            if ov.get("num_replicas") is not None and "autoscaling_config" not in ov:
                opts.pop("autoscaling_config", None)
            if ov.get("autoscaling_config") is not None and "num_replicas" not in ov:
                opts.pop("num_replicas", None)
            opts.update(ov)
        packed_runtime_env(opts, d.name)
        payload = _payload(d)
        if not opts.get("version"):
            opts["version"] = _code_version(d, payload, opts)
        items.append((d.name, payload, _config.deployment_config(opts)))
    c = _controller_or_raise()
    try:
        torus.get(c.deploy_application.remote(name, route_prefix, ingress, items, config))
    except RayTaskError as e:  # the controller refused it: the user gets the reason itself
        raise (e.cause if isinstance(e.cause, Exception) else e) from None
    if wait:
        _wait_running(c, name)
    return DeploymentHandle(ingress, name)


def _wait_running(c, name: str) -> None:
    deadline = time.monotonic() + _DEPLOY_TIMEOUT_S
    while True:
        st = torus.get(c.wait_app.remote(name, 1.0))
        if st is None:
            raise RayServeException(f"Application '{name}' was deleted while deploying.")
        if st["status"] == "RUNNING":
            return
        if st["status"] == "DEPLOY_FAILED":
            raise RuntimeError(f"Deploying application {name} failed: {st['message']}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"Application '{name}' did not start within "
                               f"{_DEPLOY_TIMEOUT_S:.0f} s: {st}")


def run(target: Application, blocking: bool = False, name: str = "default",
        route_prefix: Optional[str] = "/", logging_config=None, _blocking: bool = True,
        external_scaler_enabled: bool = False, **kwargs) -> DeploymentHandle:
    """Deploys `target` as application `name` and waits for it to run; returns a handle to its
    ingress deployment. `blocking=True` then serves until interrupted (Ctrl-C)."""
    if not isinstance(target, Application):
        from torus.serve.deployment import Deployment
        if isinstance(target, Deployment):
            raise TypeError("`serve.run` expects an `Application` returned by "
                            "`Deployment.bind()`.")
        raise TypeError(f"`serve.run` expects an `Application` returned by "
                        f"`Deployment.bind()`, got {type(target).__name__}.")
    if not isinstance(name, str) or not name:
        raise ValueError("Application name must be a non-empty string.")
    _ensure_connected()
    started = get_controller() is None
    if started:
        # The proxies start while the application's replicas do; both are waited for below.
        start(_wait_for_proxies=False)
    handle = deploy_app(target, name, route_prefix, wait=_blocking)
    if started and _blocking:
        _wait_proxies(_controller_or_raise())
    if blocking:
        try:
            while True:
                time.sleep(10)
        except KeyboardInterrupt:
            logger.info("Received interrupt; shutting down Serve.")
            shutdown()
    return handle


def delete(name: str, _blocking: bool = True) -> None:
    """Deletes application `name` (its replicas finish what they hold first)."""
    _ensure_connected()
    c = _controller_or_raise()
    torus.get(c.delete_applications.remote([name]))
    if _blocking:
        deadline = time.monotonic() + 120
        while torus.get(c.app_status.remote(name)) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Application '{name}' was not deleted within 120 s")
            time.sleep(0.02)


def shutdown(_blocking: bool = True) -> None:
    """Deletes every application and stops Serve (replicas, proxies, controller)."""
    if not torus.is_initialized():
        return
    c = get_controller()
    if c is None:
        _router.reset_routers()
        return
    try:
        torus.get(c.shutdown.remote(), timeout=90)
    except Exception as e:
        logger.warning("serve.shutdown: the controller did not stop cleanly: %s", e)
    try:
        torus.kill(c)
    except Exception:
        pass
    deadline = time.monotonic() + 10
    while get_controller() is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    _router.reset_routers()


def status():
    from torus.serve.schema import ServeStatus, status_from_controller
    _ensure_connected()
    c = get_controller()
    if c is None:
        return ServeStatus()
    return status_from_controller(torus.get(c.status.remote()))


def get_app_handle(name: str) -> DeploymentHandle:
    _ensure_connected()
    c = _controller_or_raise()
    ingress = torus.get(c.get_ingress.remote(name))
    if ingress is None:
        raise RayServeException(f"Application '{name}' does not exist.")
    return DeploymentHandle(ingress, name)


def get_deployment_handle(deployment_name: str, app_name: Optional[str] = None,
                          _check_exists: bool = True, _record_telemetry: bool = True
                          ) -> DeploymentHandle:
    _ensure_connected()
    if app_name is None:
        from torus.serve import context
        app_name = context._replica_context.app_name if context._replica_context else \
            "default"
    if _check_exists:
        c = _controller_or_raise()
        if not torus.get(c.has_deployment.remote(app_name, deployment_name)):
            raise KeyError(f"Deployment {deployment_name} in application {app_name} was not "
                           f"found.")
    return DeploymentHandle(deployment_name, app_name)
