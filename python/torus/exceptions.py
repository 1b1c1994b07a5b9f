"""Exceptions with Ray 2.60's names and behaviour (`ray.exceptions`)."""
from __future__ import annotations

import logging
import os
import socket
from typing import Optional

logger = logging.getLogger(__name__)


class RayError(Exception):
    """Base of every Torus (Ray) exception."""


class CrossLanguageError(RayError):
    """An exception raised by a task written in another language (C++)."""

    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __str__(self):
        return f"An exception raised from CPP:\n{self.message}"


class TaskCancelledError(RayError):
    def __init__(self, task_id=None, error_message: Optional[str] = None):
        self.task_id = task_id
        self.error_message = error_message
        super().__init__(task_id, error_message)

    def __str__(self):
        msg = ""
        if self.task_id:
            msg = f"Task: {self.task_id} was cancelled. "
        if self.error_message:
            msg += self.error_message
        return msg or "The task was cancelled."


_INTERNAL_FRAME_MARKERS = ("torus/_private/", "torus/_private\\")


class RayTaskError(RayError):
    """A task raised: carries the remote traceback and the original exception (`cause`).

    `ray.get` raises `as_instanceof_cause()`, an instance of both RayTaskError and the cause's
    class, so `except ValueError` catches a remote ValueError as in Ray.
    """

    def __init__(self, function_name, traceback_str, cause, proctitle=None, pid=None,
                 ip=None, actor_repr=None, actor_id=None):
        self.proctitle = proctitle or "torus::worker"
        self.pid = pid or os.getpid()
        self.ip = ip or _node_ip()
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.actor_repr = actor_repr
        self._actor_id = actor_id
        self.cause = cause
        try:
            import cloudpickle
            cloudpickle.dumps(cause)
        except Exception as e:  # an unpicklable cause travels as its text
            err_type = f"{type(cause).__module__}.{type(cause).__name__}"
            self.cause = RayError(f"Exception {err_type} isn't serializable: {e}.\n"
                                  f"Original exception details:\n{traceback_str}")
        self.args = (function_name, traceback_str, self.cause, proctitle, pid, ip)

    def __reduce__(self):
        return (RayTaskError, (self.function_name, self.traceback_str, self.cause,
                               self.proctitle, self.pid, self.ip, self.actor_repr,
                               self._actor_id))

    def as_instanceof_cause(self):
        cause_cls = type(self.cause)
        if issubclass(RayTaskError, cause_cls):
            return self
        try:
            return self._make_dual_exception_instance()
        except Exception as e:
            logger.warning("User exception type %s cannot be combined with RayTaskError (%s); "
                           "raising RayTaskError only (its .cause is the exception).",
                           cause_cls, e)
            return self

    def _make_dual_exception_instance(self):
        cause_cls = type(self.cause)
        error_msg = str(self)
        ray_task_error = self

        class cls(RayTaskError, cause_cls):
            def __init__(self, cause):
                self.cause = cause
                self._torus_args = (cause,)

            @property
            def args(self):
                return self._torus_args

            @args.setter
            def args(self, value):
                self._torus_args = value

            def __reduce__(self):
                return ray_task_error.__reduce__()

            def __getattr__(self, name):
                # Attributes of the RayTaskError first (traceback_str, pid...), then the cause.
                if name in ("function_name", "traceback_str", "proctitle", "pid", "ip",
                            "actor_repr", "_actor_id"):
                    return getattr(ray_task_error, name)
                return getattr(self.cause, name)

            def __str__(self):
                return error_msg

        name = f"RayTaskError({cause_cls.__name__})"
        cls.__name__ = name
        cls.__qualname__ = name
        if isinstance(self.cause, BaseExceptionGroup):
            inst = cls.__new__(cls, self.cause.message, self.cause.exceptions)
            cls.__init__(inst, self.cause)
            return inst
        return cls(self.cause)

    def __str__(self):
        lines = self.traceback_str.strip().split("\n")
        out = []
        skip_source = False
        for line in lines:
            if line.startswith("Traceback "):
                head = f"{self.proctitle}() (pid={self.pid}, ip={self.ip}"
                if self.actor_repr:
                    head += f", actor_id={self._actor_id}, repr={self.actor_repr})"
                else:
                    head += ")"
                out.append(head)
                skip_source = False
            elif line.startswith("  File ") and any(m in line for m in _INTERNAL_FRAME_MARKERS):
                skip_source = True
            elif skip_source and line.startswith("    "):
                pass  # the hidden frame's source line and its caret line
            else:
                skip_source = False
                out.append(line)
        return "\n".join(out)


class LocalRayletDiedError(RayError):
    def __str__(self):
        return "The task's local node died."


class WorkerCrashedError(RayError):
    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __str__(self):
        base = "The worker died unexpectedly while executing this task."
        return f"{base} {self.message}".strip() if self.message else base


class RayActorError(RayError):
    BASE_ERROR_MSG = "The actor experienced an error before finishing this task."

    def __init__(self, actor_id: str = None, error_msg: str = BASE_ERROR_MSG,
                 actor_init_failed: bool = False, preempted: bool = False):
        self.actor_id = actor_id
        self.error_msg = error_msg
        self._actor_init_failed = actor_init_failed
        self._preempted = preempted
        super().__init__(error_msg)

    def __reduce__(self):
        return (RayActorError, (self.actor_id, self.error_msg, self._actor_init_failed,
                                self._preempted))

    def __str__(self):
        return self.error_msg

    @property
    def preempted(self) -> bool:
        return self._preempted

    @property
    def actor_init_failed(self) -> bool:
        return self._actor_init_failed


class ActorDiedError(RayActorError):
    BASE_ERROR_MSG = "The actor died unexpectedly before finishing this task."

    def __init__(self, cause=None, actor_id: str = None):
        init_failed = False
        if isinstance(cause, RayTaskError):
            init_failed = True
            actor_id = actor_id or cause._actor_id
            msg = f"The actor died because of an error raised in its creation task, {cause}"
        elif isinstance(cause, str) and cause:
            msg = f"{ActorDiedError.BASE_ERROR_MSG}\n{cause}"
        else:
            msg = ActorDiedError.BASE_ERROR_MSG
        super().__init__(actor_id, msg, init_failed, False)
        self._cause = cause

    def __reduce__(self):
        return (ActorDiedError, (self._cause, self.actor_id))

    @staticmethod
    def from_task_error(task_error):
        return ActorDiedError(task_error)


class ActorUnavailableError(RayActorError):
    def __init__(self, error_message: str, actor_id=None):
        super().__init__(actor_id, f"The actor {actor_id} is unavailable: {error_message}. "
                         "The task may or may not have been executed on the actor.")


class RaySystemError(RayError):
    def __init__(self, client_exc, traceback_str=None):
        self.client_exc = client_exc
        self.traceback_str = traceback_str
        super().__init__(client_exc)

    def __str__(self):
        msg = f"System error: {self.client_exc}"
        if self.traceback_str:
            msg += f"\ntraceback: {self.traceback_str}"
        return msg


class UserCodeException(RayError):
    pass


class ObjectStoreFullError(RayError):
    pass


class OutOfDiskError(RayError):
    pass


class OutOfMemoryError(RayError):
    pass


class NodeDiedError(RayError):
    pass


class ObjectLostError(RayError):
    def __init__(self, object_ref_hex: str = "", owner_address: str = "",
                 call_site: str = "", message: str = ""):
        self.object_ref_hex = object_ref_hex
        self.owner_address = owner_address
        self.call_site = call_site
        self.message = message
        super().__init__(object_ref_hex, owner_address, call_site, message)

    def __str__(self):
        s = f"Failed to retrieve object {self.object_ref_hex}. " if self.object_ref_hex else ""
        return (s + (self.message or "All copies of the object are lost.")).strip()


class ObjectFetchTimedOutError(ObjectLostError):
    pass


class ObjectFreedError(ObjectLostError):
    pass


class OwnerDiedError(ObjectLostError):
    pass


class ObjectReconstructionFailedError(ObjectLostError):
    pass


class ObjectReconstructionFailedMaxAttemptsExceededError(ObjectLostError):
    pass


class ObjectReconstructionFailedLineageEvictedError(ObjectLostError):
    pass


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    pass


class RpcError(RayError):
    def __init__(self, message, rpc_code=None):
        self.rpc_code = rpc_code
        super().__init__(message)


class GetTimeoutError(RayError, TimeoutError):
    """`get` did not finish within its timeout."""


class PlasmaObjectNotAvailable(RayError):
    pass


class AsyncioActorExit(RayError):
    """Raised inside an async actor by exit_actor()."""


class RuntimeEnvSetupError(RayError):
    def __init__(self, error_message: str = None):
        self.error_message = error_message
        super().__init__(error_message)

    def __str__(self):
        msg = "Failed to set up runtime environment."
        return f"{msg}\n{self.error_message}" if self.error_message else msg


class TaskPlacementGroupRemoved(RayError):
    def __str__(self):
        return "The placement group corresponding to this task has been removed."


class ActorPlacementGroupRemoved(RayError):
    def __str__(self):
        return "The placement group corresponding to this Actor has been removed."


class PendingCallsLimitExceeded(RayError):
    pass


class TaskUnschedulableError(RayError):
    def __init__(self, error_message: str):
        self.error_message = error_message
        super().__init__(error_message)

    def __str__(self):
        return f"The task is not schedulable: {self.error_message}"


class ActorUnschedulableError(RayError):
    def __init__(self, error_message: str):
        self.error_message = error_message
        super().__init__(error_message)

    def __str__(self):
        return f"The actor is not schedulable: {self.error_message}"


class UnserializableException(RayError):
    def __init__(self, original_stack_trace: str):
        self._original_stack_trace = original_stack_trace
        super().__init__(original_stack_trace)

    def __str__(self):
        return ("Failed to deserialize exception. Refer to the original stack trace:\n"
                + self._original_stack_trace)


class ActorAlreadyExistsError(ValueError, RayError):
    pass


class ActorHandleNotFoundError(ValueError, RayError):
    pass


class SliceLostError(RayError):
    """Torus: a host of a granted TPU slice was lost (docs/tpu.md §6)."""


def _node_ip() -> str:
    ip = os.environ.get("TORUS_NODE_ADDRESS", "")
    if ip:
        return ip.rsplit(":", 1)[0]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
