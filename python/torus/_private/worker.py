"""Driver (and worker) state: init/shutdown, get/put/wait, the mapping of `_core` errors.

One runtime per process (`torus._core`). In a worker process the runtime was started by
`_core.run_worker`; `init()` there is a no-op and every call goes straight to `_core`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from torus import exceptions as exc
from torus._private import serialization

logger = logging.getLogger("torus")

_lock = threading.RLock()
_generation = 0          # bumped by shutdown: refs of an older runtime release nothing
_core_mod = None
_namespace: Optional[str] = None
_job_env: Dict[str, str] = {}
exported: Dict[str, bool] = {}   # function keys exported to this cluster's KV
_atexit_registered = False


def core():
    """The `torus._core` module (imported lazily so that pure-Python parts import without it)."""
    global _core_mod
    if _core_mod is None:
        try:
            from torus import _core as m
        except ImportError as e:
            raise ImportError(
                "torus._core (the C++ extension) is not built/installed: install with "
                "`pip install .` at the Torus repository root") from e
        _core_mod = m
    return _core_mod


def generation() -> int:
    return _generation


def in_worker() -> bool:
    return os.environ.get("TORUS_WORKER_MODE") == "1"


def is_initialized() -> bool:
    try:
        return bool(core().is_initialized())
    except ImportError:
        return False


# ------------------------------------------------------------------------------------------
# init / shutdown
# ------------------------------------------------------------------------------------------

_SHIM_ENV = "TORUS_RAY_SHIM"


def worker_command() -> List[str]:
    """The command nodes start Python workers with: this interpreter, this import path."""
    paths = [p if p else os.getcwd() for p in sys.path]
    shim = os.environ.get(_SHIM_ENV) == "1"
    boot = (
        "import sys\n"
        f"sys.path[:0] = [p for p in {paths!r} if p not in sys.path]\n"
        + ("from torus._private import shim as _s; _s.install()\n" if shim else "")
        + "from torus._private import worker_main\n"
        "worker_main.main()\n"
    )
    return [sys.executable, "-c", boot]


class RayContext(dict):
    """What `init` returns (Ray returns a dict-like context)."""

    def __init__(self, info: Dict[str, Any]):
        super().__init__(info)
        self.address_info = info
        self.dashboard_url = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        shutdown()

    def disconnect(self):
        shutdown()


def _spill_dir_of_system_config(system_config) -> Optional[str]:
    """The directory of Ray's older spelling, _system_config={"object_spilling_config":
    json.dumps({"type": "filesystem", "params": {"directory_path": DIR or [DIR, ...]}})}: the
    first directory (Torus spills each node to one). Other types (smart_open to S3, ...) are
    refused: Torus spills to local disk only."""
    if not system_config or "object_spilling_config" not in system_config:
        return None
    cfg = system_config["object_spilling_config"]
    if isinstance(cfg, str):
        cfg = json.loads(cfg)
    if cfg.get("type", "filesystem") != "filesystem":
        raise NotImplementedError(f"object_spilling_config type {cfg.get('type')!r}: Torus spills "
                                  "to a local directory only (type 'filesystem')")
    path = cfg.get("params", {}).get("directory_path")
    if isinstance(path, (list, tuple)):
        path = path[0] if path else None
    return str(path) if path else None


def init(address: Optional[str] = None, *, num_cpus=None, num_gpus=None, resources=None,
         labels=None, object_store_memory=None, object_spilling_directory=None,
         local_mode: bool = False,
         ignore_reinit_error: bool = False, namespace: Optional[str] = None,
         runtime_env: Optional[Dict[str, Any]] = None, log_to_driver: bool = True,
         _temp_dir: Optional[str] = None, **kwargs):
    """Connects to a cluster or starts a private one (Ray's rules).

    No address and neither TORUS_ADDRESS nor RAY_ADDRESS set: a private local cluster in this
    process. "auto" or one of the variables: connect to the running cluster.
    """
    global _namespace, _job_env
    for k in kwargs:
        if k == "job_config":
            continue  # used below
        if k.startswith("_") or k in ("include_dashboard", "dashboard_host", "dashboard_port",
                                      "configure_logging", "logging_level", "logging_format",
                                      "logging_config", "_system_config"):
            continue  # observability knobs: nothing to configure here
        raise TypeError(f"init() got an unexpected keyword argument '{k}'")
    if local_mode:
        raise NotImplementedError("torus.init(local_mode=True) is not implemented by Torus")
    if object_spilling_directory is None:
        object_spilling_directory = _spill_dir_of_system_config(kwargs.get("_system_config"))
    with _lock:
        if is_initialized():
            if in_worker():
                return RayContext(_context_dict())
            if ignore_reinit_error:
                logger.info("Calling torus.init() again after it has already been called.")
                return RayContext(_context_dict())
            raise RuntimeError("Maybe you called torus.init twice by accident? This error can "
                               "be suppressed by passing in 'ignore_reinit_error=True' or by "
                               "calling 'torus.shutdown()' prior to 'torus.init()'.")
        # None: TORUS_ADDRESS / RAY_ADDRESS, else a running cluster of this machine's latest
        # session, else a private one (the core decides, docs/python.md); "auto": the running
        # cluster or an error; "local": always a private cluster.
        if address is None:
            address = os.environ.get("TORUS_ADDRESS") or os.environ.get("RAY_ADDRESS") or ""
        if address.startswith("ray://") or address.startswith("torus://"):
            raise NotImplementedError(f"torus.init(address='{address}'): Ray Client "
                                      "(ray://) is not implemented by Torus; connect with "
                                      "the head's host:port or 'auto'")
        if address.startswith("http://") or address.startswith("https://"):
            raise NotImplementedError("torus.init with a dashboard (http) address is not "
                                      "implemented by Torus")
        head_args: List[str] = []
        if address in ("", "local"):
            if num_cpus is not None:
                head_args += ["--num-cpus", str(num_cpus)]
            if num_gpus is not None:
                head_args += ["--num-gpus", str(num_gpus)]
            if resources:
                head_args += ["--resources", json.dumps(resources)]
            if labels:
                head_args += ["--labels", json.dumps({str(k): str(v) for k, v in labels.items()})]
            if object_store_memory is not None:
                head_args += ["--object-store-memory", str(int(object_store_memory))]
            if object_spilling_directory is not None:
                head_args += ["--object-spilling-directory",
                              os.path.abspath(str(object_spilling_directory))]
        elif any(v is not None for v in (num_cpus, num_gpus, resources, labels,
                                         object_store_memory, object_spilling_directory)):
            raise ValueError("When connecting to an existing cluster, num_cpus, num_gpus, "
                             "resources, labels and object_store_memory must not be provided.")
        job_config = kwargs.get("job_config")
        if job_config is not None:
            if runtime_env is None and job_config.runtime_env:
                runtime_env = job_config.runtime_env
            if namespace is None and job_config.ray_namespace:
                namespace = job_config.ray_namespace
        from torus._private import runtime_env as _renv
        resolved = _renv.resolve(runtime_env, "torus.init")
        env_vars = resolved.env
        cmd = worker_command()
        # Python workers are started with `cmd` and submit nested work with the command their
        # node started them with (TORUS_PYTHON_WORKER_COMMAND, set by the node): the same.
        try:
            core().init(address, namespace or "", dict(env_vars), cmd,
                        _temp_dir or "", head_args,
                        bool(job_config and job_config.default_actor_lifetime == "detached"),
                        list(job_config.code_search_path) if job_config else [])
        except Exception as e:
            mapped = map_core_error(e)
            if address and isinstance(mapped, exc.RaySystemError):
                raise ConnectionError(f"Could not connect to the Torus cluster at "
                                      f"'{address}': {e}") from None
            raise mapped from None
        if resolved.packages:  # before any work that needs them can be submitted
            try:
                resolved.upload()
            except Exception:
                core().shutdown()
                raise
        _namespace = namespace
        _job_env = env_vars
        exported.clear()
        global _atexit_registered
        if not _atexit_registered:  # stop the runtime while the interpreter is still whole
            import atexit
            atexit.register(shutdown, True)
            _atexit_registered = True
        return RayContext(_context_dict())


def _context_dict() -> Dict[str, Any]:
    c = dict(core().context())
    return {"address": c.get("head_address", ""), "node_id": c.get("node_id", ""),
            "session_dir": c.get("session_dir", ""), "namespace": c.get("namespace", ""),
            "job_id": c.get("job_id", "")}


def ensure_initialized() -> None:
    if not is_initialized():
        init()


def shutdown(_exiting_interpreter: bool = False) -> None:
    global _generation
    with _lock:
        try:
            if is_initialized() and not in_worker():
                core().shutdown()
        finally:
            _generation += 1
            exported.clear()


def release_ref(object_id, gen: int) -> None:
    if gen != _generation or _core_mod is None:
        return
    if _core_mod.is_initialized():
        _core_mod.remove_ref(object_id)


def runtime_env_json(runtime_env, where: str) -> str:
    """A task's or actor's runtime_env as the core carries it (its variables, package URIs
    included: _private/runtime_env.py), its packages uploaded."""
    from torus._private import runtime_env as _renv
    r = _renv.resolve(runtime_env, where)
    if r.packages:
        r.upload()
    return json.dumps({"env_vars": r.env}) if r.env else ""


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------

def _object_hex(msg: str) -> str:
    """The first object id ("<32 hex>@host:port") a core error message names, as Ray's hex."""
    m = re.search(r"\b([0-9a-f]{32})@", msg)
    return m.group(1) if m else ""


def map_core_error(e: BaseException) -> BaseException:
    """A `_core` exception as the `torus.exceptions` class Ray would raise."""
    c = _core_mod
    if c is None or isinstance(e, exc.RayError):
        return e
    msg = str(e)

    def is_(name):
        t = getattr(c, name, None)
        return t is not None and isinstance(e, t)

    if is_("GetTimeoutError"):
        return exc.GetTimeoutError(msg)
    if is_("FunctionNotFoundError"):
        return exc.RaySystemError(msg)
    if is_("TaskCancelledError"):
        return exc.TaskCancelledError(error_message=msg)
    if is_("ActorDiedError"):
        return exc.ActorDiedError(msg)
    if is_("WorkerCrashedError"):
        return exc.WorkerCrashedError(msg)
    if is_("OwnerDiedError"):
        return exc.OwnerDiedError(_object_hex(msg), message=msg)
    if is_("ObjectLostError"):
        return exc.ObjectLostError(_object_hex(msg), message=msg)
    if is_("RuntimeEnvError"):
        return exc.RuntimeEnvSetupError(msg)
    if is_("SliceLostError"):
        return exc.SliceLostError(msg)
    if is_("TaskError"):
        return exc.RayTaskError("", msg, exc.CrossLanguageError(msg)).as_instanceof_cause()
    if is_("InvalidArgument"):
        return ValueError(msg)
    if is_("Error"):
        return exc.RaySystemError(msg)
    return e


# ------------------------------------------------------------------------------------------
# objects
# ------------------------------------------------------------------------------------------

def _raise_if_error(value):
    if isinstance(value, exc.RayTaskError):
        raise value.as_instanceof_cause()
    if isinstance(value, exc.RayError):
        raise value
    return value


def put(value: Any, *, _owner=None):
    from torus.object_ref import ObjectRef
    if isinstance(value, ObjectRef):
        raise TypeError("Calling 'put' on an ray.ObjectRef is not allowed. If you really "
                        "want to do this, you can wrap the ray.ObjectRef in a list and call "
                        "'put' on it.")
    if _owner is not None:
        raise NotImplementedError("torus.put(_owner=...) is not implemented by Torus")
    ensure_initialized()
    size, parts, nested = serialization.serialize(value)
    try:
        oid = core().put(size, parts, nested)
    except Exception as e:
        raise map_core_error(e) from None
    return ObjectRef(oid)


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number or None")
    return int(timeout * 1000)


def get(object_refs, *, timeout: Optional[float] = None):
    from torus.object_ref import ObjectRef
    from torus.util.placement_group import _ReadyRef
    ensure_initialized()
    single = isinstance(object_refs, ObjectRef)
    if single:
        refs = [object_refs]
    elif isinstance(object_refs, (list, tuple)):
        refs = list(object_refs)
        for r in refs:
            if not isinstance(r, ObjectRef):
                raise TypeError(f"'object_refs' must either be an ObjectRef or a list of "
                                f"ObjectRefs, got a list holding {type(r)}")
    else:
        raise ValueError(f"'object_refs' must either be an ObjectRef or a list of "
                         f"ObjectRefs, got {type(object_refs)}")
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    _timeout_ms(timeout)
    # Placement-group readiness refs are local futures, answered by the head directly.
    special = {i: r for i, r in enumerate(refs) if isinstance(r, _ReadyRef)}
    values: List[Any] = [None] * len(refs)
    for i, r in special.items():
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        values[i] = r._wait_value(left)
    plain = [(i, r) for i, r in enumerate(refs) if i not in special]
    if plain:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            bufs = core().get([r._id for _, r in plain], _timeout_ms(left))
        except Exception as e:
            raise map_core_error(e) from None
        for (i, _), b in zip(plain, bufs):
            values[i] = serialization.deserialize(b)
    for v in values:
        _raise_if_error(v)
    return values[0] if single else values


def wait(object_refs, *, num_returns: int = 1, timeout: Optional[float] = None,
         fetch_local: bool = True):
    from torus.object_ref import ObjectRef
    from torus.util.placement_group import _ReadyRef
    ensure_initialized()
    if isinstance(object_refs, ObjectRef):
        raise TypeError("wait() expected a list of ray.ObjectRef, got a single ray.ObjectRef")
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"wait() expected a list of ray.ObjectRef, got {type(object_refs)}")
    refs = list(object_refs)
    for r in refs:
        if not isinstance(r, ObjectRef):
            raise TypeError(f"wait() expected a list of ray.ObjectRef, got list containing "
                            f"{type(r)}")
    if len(set(refs)) != len(refs):
        raise ValueError("Wait requires a list of unique object refs.")
    if num_returns <= 0:
        raise ValueError("Invalid number of objects to return %d." % num_returns)
    if num_returns > len(refs):
        raise ValueError("num_returns cannot be greater than the number of objects provided "
                         f"to ray.wait: {num_returns} > {len(refs)}")
    if not refs:
        return [], []
    _timeout_ms(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    special = [i for i, r in enumerate(refs) if isinstance(r, _ReadyRef)]
    plain = [i for i, r in enumerate(refs) if not isinstance(r, _ReadyRef)]
    plain_ids = [refs[i]._id for i in plain]
    ready = [False] * len(refs)
    while True:
        for i in special:
            ready[i] = refs[i]._poll()
        need = num_returns - sum(ready[i] for i in special)
        if plain:
            if not special:  # the common case: one blocking call
                wait_ms = _timeout_ms(timeout)
            elif need <= 0:
                wait_ms = 0
            else:  # placement-group refs are polled: wait in short slices
                wait_ms = 50 if deadline is None else max(
                    0, min(50, int((deadline - time.monotonic()) * 1000)))
            try:
                flags = core().wait(plain_ids, max(1, min(need, len(plain))), wait_ms)
            except Exception as e:
                raise map_core_error(e) from None
            for i, f in zip(plain, flags):
                ready[i] = bool(f)
        elif need > 0:
            time.sleep(0.02)
        if (not special or sum(ready) >= num_returns
                or (deadline is not None and time.monotonic() >= deadline)):
            break
    ready_list, not_ready = [], []
    for r, f in zip(refs, ready):
        if f and len(ready_list) < num_returns:
            ready_list.append(r)
        else:
            not_ready.append(r)
    return ready_list, not_ready


# ------------------------------------------------------------------------------------------
# arguments of calls
# ------------------------------------------------------------------------------------------



def encode_args(args: Sequence[Any], kwargs: Dict[str, Any]):
    """Task arguments as `_core` takes them; keeps the refs alive until submission.

    A top-level ObjectRef is passed by reference (the task gets its value, as in Ray);
    keyword arguments follow the positional ones, then a 'K' value naming them.
    """
    from torus.object_ref import ObjectRef
    out = []
    keep = []
    items = list(args) + list(kwargs.values())
    for a in items:
        if isinstance(a, ObjectRef):
            out.append((True, a._id, []))
            continue
        size, parts, nested = serialization.serialize(a)
        if size > serialization.INLINE_LIMIT:
            ref = ObjectRef(core().put(size, parts, nested))
            keep.append(ref)
            out.append((True, ref._id, []))
        else:
            out.append((False, serialization.join(size, parts), nested))
    if kwargs:
        data, _ = serialization.serialize_to_bytes(tuple(kwargs.keys()),
                                                   serialization.KIND_KWARGS)
        out.append((False, data, []))
    return out, keep


def export(key: str, payload: bytes) -> None:
    """Exports a function or class to the head's KV once per cluster (namespace `fn`)."""
    if key in exported:
        return
    with _lock:
        if key in exported:
            return
        try:
            core().kv_put("fn", key, payload, False)
        except Exception as e:
            raise map_core_error(e) from None
        exported[key] = True


def current_namespace() -> str:
    return dict(core().context()).get("namespace", "") or (_namespace or "")
