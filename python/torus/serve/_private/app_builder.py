"""Applications from Serve's config format: `import_path` ("module:attr" or "module.attr") names
an `Application` (the result of `.bind()`) or a builder function that takes the `args` dict and
returns one; `deployments` entries override the options of the deployments they name.

`build_from_config` runs in a task (the controller's `serve deploy`/REST path, with the
application's runtime_env) or in the driver (`serve run`); it imports user code, so it never
runs inside the controller. No state, no threads.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from torus.serve._private.payload import dumps as _payload_dumps

from torus.serve import config as _config


def import_attr(import_path: str):
    from torus._private import shim
    shim.install()  # applications are Ray programs: `import ray` in them is Torus
    if ":" in import_path:
        module, _, attr = import_path.partition(":")
    else:
        module, _, attr = import_path.rpartition(".")
    if not module or not attr:
        raise ValueError(f"import_path must be 'module:attribute' or 'module.attribute', got "
                         f"{import_path!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    mod = importlib.import_module(module)
    try:
        obj = mod
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ImportError(f"module '{module}' has no attribute '{attr}' "
                          f"(import_path {import_path!r})") from None
    return obj


def load_application(import_path: str, args: Optional[Dict[str, Any]] = None):
    from torus.serve.deployment import Application
    obj = import_attr(import_path)
    if isinstance(obj, Application):
        if args:
            raise ValueError(f"args were given but {import_path!r} is an Application, not an "
                             f"application builder function")
        return obj
    if callable(obj):
        app = obj(dict(args or {}))
        if not isinstance(app, Application):
            raise TypeError(f"The application builder {import_path!r} returned "
                            f"{type(app).__name__}, not an Application (the result of "
                            f"`.bind()`).")
        return app
    raise TypeError(f"{import_path!r} is a {type(obj).__name__}, not an Application or an "
                    f"application builder function.")


_OVERRIDE_KEYS = ("num_replicas", "max_ongoing_requests", "max_queued_requests", "user_config",
                  "autoscaling_config", "graceful_shutdown_wait_loop_s",
                  "graceful_shutdown_timeout_s", "health_check_period_s",
                  "health_check_timeout_s", "ray_actor_options", "placement_group_bundles",
                  "placement_group_strategy", "max_replicas_per_node", "version")


def packed_runtime_env(opts: Dict[str, Any], deployment: str) -> None:
    """Packs a deployment's local working_dir / py_modules once, here, into URIs (its code
    version then changes with their content), rather than on every replica start."""
    rao = opts.get("ray_actor_options")
    if isinstance(rao, dict) and rao.get("runtime_env"):
        from torus._private import runtime_env as _renv
        opts["ray_actor_options"] = dict(rao, runtime_env=_renv.with_uris(
            rao["runtime_env"], f"deployment '{deployment}'"))


def build_from_config(app_cfg: Dict[str, Any]) -> Tuple[str, List[Tuple[str, bytes, dict]]]:
    """(ingress name, [(deployment name, payload, options)]) of one config-file application."""
    from torus.serve.deployment import build_app
    name = app_cfg.get("name") or "default"
    app = load_application(app_cfg["import_path"], app_cfg.get("args"))
    deployments, ingress = build_app(app, name)
    overrides = {d["name"]: {k: v for k, v in d.items() if k in _OVERRIDE_KEYS and v is not None}
                 for d in app_cfg.get("deployments") or []}
    known = {d.name for d in deployments}
    for dname in overrides:
        if dname not in known:
            raise ValueError(f"The config overrides deployment '{dname}', which application "
                             f"'{name}' does not have (it has {sorted(known)}).")
    base = json.dumps({k: app_cfg.get(k) for k in ("import_path", "runtime_env", "args")},
                      sort_keys=True, default=str)
    out = []
    app_env = app_cfg.get("runtime_env") or {}
    for d in deployments:
        opts = dict(d.options)
        ov = overrides.get(d.name, {})
        if app_env:
            # The application's runtime_env is each deployment's default, field by field.
            from torus._private import runtime_env as _renv
            rao = dict(ov.get("ray_actor_options") or opts.get("ray_actor_options") or {})
            rao["runtime_env"] = _renv.merge(app_env, rao.get("runtime_env"))
            ov = dict(ov, ray_actor_options=rao)
        if ov.get("num_replicas") is not None and "autoscaling_config" not in ov:
            opts.pop("autoscaling_config", None)
        if ov.get("autoscaling_config") is not None and "num_replicas" not in ov:
            opts.pop("num_replicas", None)
        opts.update(ov)
        packed_runtime_env(opts, d.name)
        if not opts.get("version"):
            # Same config, same code version: a redeploy of an unchanged config keeps the
            # replicas; a changed user_config reconfigures them in place (as Ray does).
            heavy = {k: v for k, v in opts.items() if k not in _config.LIGHTWEIGHT_OPTIONS}
            opts["version"] = hashlib.sha1((base + d.name + json.dumps(
                heavy, sort_keys=True, default=str)).encode()).hexdigest()[:16]
        payload = _payload_dumps((d.func_or_class, d.args, d.kwargs))
        out.append((d.name, payload, _config.deployment_config(opts)))
    return ingress, out
