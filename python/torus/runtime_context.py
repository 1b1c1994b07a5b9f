"""get_runtime_context(): ids and resources of the current driver, task or actor."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from torus._private import worker


class RuntimeContext:
    def _ctx(self) -> Dict[str, Any]:
        worker.ensure_initialized()
        return dict(worker.core().context())

    def get(self) -> Dict[str, Any]:
        c = self._ctx()
        return {"job_id": c.get("job_id"), "node_id": c.get("node_id"),
                "namespace": c.get("namespace"), "task_id": c.get("task_id"),
                "actor_id": c.get("actor_id") or None}

    # ids ----------------------------------------------------------------------------------
    def get_job_id(self) -> str:
        return _hex(self._ctx().get("job_id"))

    def get_node_id(self) -> str:
        return _hex(self._ctx().get("node_id"))

    def get_worker_id(self) -> str:
        return _hex(self._ctx().get("worker_id"))

    def get_task_id(self) -> Optional[str]:
        c = self._ctx()
        t = c.get("task_id")
        return _hex(t) if t and not c.get("is_driver") else None

    def get_actor_id(self) -> Optional[str]:
        from torus._private import executor
        a = executor.current_actor_id() or self._ctx().get("actor_id")
        return _hex(a) if a else None

    def get_task_name(self) -> Optional[str]:
        return self._ctx().get("task_name") or None

    def get_task_function_name(self) -> Optional[str]:
        return self.get_task_name()

    def get_actor_name(self) -> Optional[str]:
        return self._ctx().get("actor_name") or None

    def get_placement_group_id(self) -> Optional[str]:
        p = self._ctx().get("placement_group_id")
        return _hex(p) if p else None

    def get_node_labels(self) -> Dict[str, str]:
        node = self.get_node_id()
        for n in worker.core().nodes():
            if _hex(n.get("node_id")) == node:
                return dict(n.get("labels") or {})
        return {}

    @property
    def namespace(self) -> str:
        return self._ctx().get("namespace", "")

    def get_namespace(self) -> str:
        return self.namespace

    @property
    def job_id(self):
        return self.get_job_id()

    @property
    def node_id(self):
        return self.get_node_id()

    @property
    def actor_id(self):
        return self.get_actor_id()

    @property
    def task_id(self):
        return self.get_task_id()

    @property
    def gcs_address(self) -> str:
        return self._ctx().get("head_address", "")

    @property
    def was_current_actor_restarted(self) -> bool:
        return bool(self._ctx().get("was_restarted", False))

    @property
    def current_actor(self):
        from torus.actor import ActorHandle
        a = self._ctx().get("actor_id")
        if not a:
            raise RuntimeError("This method is only available in an actor.")
        return ActorHandle(a)

    @property
    def should_capture_child_tasks_in_placement_group(self) -> bool:
        return worker.in_worker() and bool(worker.core().capture_group())

    def get_runtime_env_string(self) -> str:
        import json
        from torus._private.runtime_env import describe
        return json.dumps(describe(worker._job_env)) if worker._job_env else "{}"

    @property
    def runtime_env(self):
        import json
        return json.loads(self.get_runtime_env_string())

    # resources ----------------------------------------------------------------------------
    def get_assigned_resources(self) -> Dict[str, float]:
        c = self._ctx()
        if c.get("is_driver"):
            raise AssertionError("This method is only available when the process is a "
                                 "worker. Current mode: SCRIPT_MODE")
        return {k: float(v) for k, v in (c.get("assigned_resources") or {}).items()}

    def get_accelerator_ids(self) -> Dict[str, List[str]]:
        out: Dict[str, List[str]] = {"GPU": [], "TPU": []}
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
        if gpus:
            out["GPU"] = [g for g in gpus.split(",") if g]
        chips = os.environ.get("TPU_VISIBLE_CHIPS")
        if chips:
            out["TPU"] = [c for c in chips.split(",") if c]
        else:
            c = self._ctx()
            if not c.get("is_driver"):
                # A whole host gets no TPU_VISIBLE_CHIPS (docs/tpu.md §7): all its chips.
                n = int((c.get("assigned_resources") or {}).get("TPU", 0))
                if n:
                    out["TPU"] = [str(i) for i in range(n)]
        return out


def _hex(v) -> str:
    if v is None:
        return ""
    from torus.object_ref import id_hex
    return id_hex(v)


_context = RuntimeContext()


def get_runtime_context() -> RuntimeContext:
    return _context
