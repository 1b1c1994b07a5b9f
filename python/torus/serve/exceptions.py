"""Serve's exceptions, with Ray 2.60's names (`ray.serve.exceptions`)."""
from __future__ import annotations

from typing import Optional

from torus.exceptions import TaskCancelledError


class RayServeException(Exception):
    pass


class BackPressureError(RayServeException):
    """A request was refused because the deployment's `max_queued_requests` are waiting."""

    def __init__(self, num_queued_requests: int, max_queued_requests: int,
                 status_code: int = 503, retry_after_s: Optional[float] = None):
        # Every argument goes to the base class so the error survives pickling.
        super().__init__(num_queued_requests, max_queued_requests, status_code, retry_after_s)
        self._message = (f"Request dropped due to backpressure (num_queued_requests="
                         f"{num_queued_requests}, max_queued_requests={max_queued_requests}).")
        self._status_code = status_code
        self._retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message

    @property
    def status_code(self) -> int:
        return self._status_code

    @property
    def retry_after_s(self) -> Optional[float]:
        return self._retry_after_s


class RequestCancelledError(RayServeException, TaskCancelledError):
    def __init__(self, request_id: Optional[str] = None):
        TaskCancelledError.__init__(self, None, None)
        self.args = (request_id,)
        self._request_id = request_id

    def __str__(self):
        if self._request_id:
            return f"Request {self._request_id} was cancelled."
        return "Request was cancelled."


class DeploymentUnavailableError(RayServeException):
    """The deployment cannot take requests: it failed to deploy."""

    def __init__(self, deployment_id):
        super().__init__(str(deployment_id))
        self._deployment_id = deployment_id

    @property
    def message(self) -> str:
        return f"{self._deployment_id} is unavailable because it failed to deploy."

    def __str__(self):
        return self.message


class ReplicaUnavailableError(RayServeException):
    """The replica a request went to died before answering it."""

    def __init__(self, replica_id: str, detail: str = ""):
        super().__init__(replica_id, detail)
        self._replica_id = replica_id
        self._detail = detail

    @property
    def message(self) -> str:
        m = f"Replica {self._replica_id} is no longer available."
        return f"{m} {self._detail}" if self._detail else m

    def __str__(self):
        return self.message
