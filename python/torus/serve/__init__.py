"""Ray Serve's API on Torus: `from ray import serve` under `python -m torus.ray`, or
`from torus import serve`.

Models behind HTTP and handles: deployments of replicas (actors) run by a controller, reached
through a proxy per node and per-process routers. docs/serve.md describes the design.
"""
from torus.serve.api import (delete, get_app_handle, get_deployment_handle, run,  # noqa: F401
                             shutdown, start, status)
from torus.serve.batching import batch  # noqa: F401
from torus.serve.config import AutoscalingConfig, HTTPOptions, ProxyLocation, \
    gRPCOptions  # noqa: F401
from torus.serve.context import get_multiplexed_model_id, get_replica_context  # noqa: F401
from torus.serve.deployment import Application, Deployment, deployment  # noqa: F401
from torus.serve.handle import DeploymentHandle, DeploymentResponse, \
    DeploymentResponseGenerator  # noqa: F401
from torus.serve._private.ingress import ingress  # noqa: F401
from torus.serve.multiplex import multiplexed  # noqa: F401
from torus.serve import exceptions  # noqa: F401
from torus.serve import handle  # noqa: F401
from torus.serve import config  # noqa: F401
from torus.serve import schema  # noqa: F401

__all__ = ["batch", "deployment", "run", "start", "delete", "shutdown", "status", "ingress",
           "get_app_handle", "get_deployment_handle", "get_replica_context",
           "get_multiplexed_model_id", "multiplexed", "Application", "Deployment",
           "DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator",
           "AutoscalingConfig", "HTTPOptions", "ProxyLocation", "gRPCOptions"]
