"""What a replica knows of itself (`serve.get_replica_context()`) and of the request it is
running (a context variable, so each concurrent request on the replica's event loop or in its
thread pool sees its own)."""
from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class DeploymentID:
    name: str
    app_name: str = "default"

    def __str__(self):
        return f"Deployment(name='{self.name}', app='{self.app_name}')"


@dataclass(frozen=True)
class ReplicaID:
    unique_id: str
    deployment_id: DeploymentID

    def to_full_id_str(self) -> str:
        return f"{self.deployment_id.app_name}#{self.deployment_id.name}#{self.unique_id}"

    def __str__(self):
        return f"Replica(id='{self.unique_id}', deployment='{self.deployment_id.name}', " \
               f"app='{self.deployment_id.app_name}')"


@dataclass
class ReplicaContext:
    """The replica's identity and its user object (`servable_object`)."""
    replica_id: ReplicaID
    servable_object: Any = None
    rank: int = 0
    world_size: int = 1

    @property
    def app_name(self) -> str:
        return self.replica_id.deployment_id.app_name

    @property
    def deployment(self) -> str:
        return self.replica_id.deployment_id.name

    @property
    def replica_tag(self) -> str:
        return self.replica_id.unique_id


@dataclass
class RequestContext:
    route: str = ""
    request_id: str = ""
    app_name: str = ""
    multiplexed_model_id: str = ""


_replica_context: Optional[ReplicaContext] = None
_request_context: contextvars.ContextVar = contextvars.ContextVar(
    "torus_serve_request_context", default=RequestContext())


def _set_replica_context(ctx: Optional[ReplicaContext]) -> None:
    global _replica_context
    _replica_context = ctx


def get_replica_context() -> ReplicaContext:
    """The context of the replica this code runs in; raises outside a replica, as in Ray."""
    from torus.serve.exceptions import RayServeException
    if _replica_context is None:
        raise RayServeException("`serve.get_replica_context()` may only be called from within "
                                "a Ray Serve deployment.")
    return _replica_context


def get_request_context() -> RequestContext:
    return _request_context.get()


def get_multiplexed_model_id() -> str:
    """The model id the running request asked for (the `serve_multiplexed_model_id` header, or
    `handle.options(multiplexed_model_id=...)`); "" if none."""
    return _request_context.get().multiplexed_model_id
