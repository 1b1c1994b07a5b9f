"""Ray Serve's API on Torus: `from ray import serve` under `python -m torus.ray`, or
`from torus import serve`.

Models behind HTTP and handles: deployments of replicas (actors) run by a controller, reached
through a proxy per machine and per-process routers. docs/serve.md describes the design.
Names load on first use, so Serve's own processes (controller, replicas) import only what they
run (pydantic and FastAPI cost ~0.1-0.2 s of each process's start).
"""
import importlib

# `deployment` is both a submodule and the decorator: bound here, after the submodule, so the
# decorator wins (deployment.py itself is light; its options check loads pydantic when used).
from torus.serve.deployment import Application, Deployment, deployment  # noqa: F401,E402

_NAMES = {
    "delete": "torus.serve.api", "get_app_handle": "torus.serve.api",
    "get_deployment_handle": "torus.serve.api", "run": "torus.serve.api",
    "shutdown": "torus.serve.api", "start": "torus.serve.api", "status": "torus.serve.api",
    "batch": "torus.serve.batching",
    "AutoscalingConfig": "torus.serve.config", "HTTPOptions": "torus.serve.config",
    "ProxyLocation": "torus.serve.config", "gRPCOptions": "torus.serve.config",
    "get_multiplexed_model_id": "torus.serve.context",
    "get_replica_context": "torus.serve.context",
    "Application": "torus.serve.deployment", "Deployment": "torus.serve.deployment",
    "deployment": "torus.serve.deployment",
    "DeploymentHandle": "torus.serve.handle", "DeploymentResponse": "torus.serve.handle",
    "DeploymentResponseGenerator": "torus.serve.handle",
    "ingress": "torus.serve._private.ingress",
    "multiplexed": "torus.serve.multiplex",
}
_MODULES = ("exceptions", "handle", "config", "schema", "context", "deployment", "batching",
            "multiplex", "api")

__all__ = sorted(_NAMES)


def __getattr__(name):
    mod = _NAMES.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(mod), name)
    elif name in _MODULES:
        value = importlib.import_module(f"torus.serve.{name}")
    else:
        raise AttributeError(f"module 'torus.serve' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_NAMES) + list(_MODULES))
