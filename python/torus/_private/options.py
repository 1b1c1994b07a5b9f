"""Validation of `.options(...)` / `@remote(...)` and their translation to `_core` options."""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Optional

from torus._private import worker

_COMMON = {
    "num_cpus", "num_gpus", "resources", "memory", "accelerator_type", "name", "namespace",
    "scheduling_strategy", "label_selector", "fallback_strategy", "runtime_env",
    "_metadata", "enable_task_events", "_labels", "object_store_memory",
    "_generator_backpressure_num_objects", "tensor_transport",
}
TASK_OPTIONS = _COMMON | {"num_returns", "max_retries", "retry_exceptions", "max_calls"}
ACTOR_OPTIONS = _COMMON | {"max_restarts", "max_task_retries", "max_concurrency", "lifetime",
                           "get_if_exists", "max_pending_calls", "concurrency_groups",
                           "allow_out_of_order_execution", "_max_pending_calls"}
METHOD_OPTIONS = {"num_returns", "name", "max_task_retries", "retry_exceptions",
                  "concurrency_group", "_generator_backpressure_num_objects",
                  "enable_task_events", "tensor_transport", "_metadata"}

# Accepted but meaningless here (observability / tuning knobs with no effect on results).
_IGNORED = {"enable_task_events", "_metadata", "_labels", "max_calls",
            "max_pending_calls", "_max_pending_calls"}


def validate(opts: Dict[str, Any], allowed, what: str) -> None:
    for k, v in opts.items():
        if k not in allowed:
            raise ValueError(f"Invalid option keyword {k} for {what}. Valid ones are "
                             f"{sorted(allowed)}.")
    for k in ("num_cpus", "num_gpus", "memory"):
        v = opts.get(k)
        if v is not None:
            check_quantity(k, v, keyword=k)
    res = opts.get("resources")
    if res is not None:
        if not isinstance(res, dict):
            raise TypeError("The 'resources' option must be a dict")
        if "CPU" in res or "GPU" in res:
            raise ValueError("Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and "
                             "'GPU' in 'resources' keyword")
        for name, v in res.items():
            check_quantity(name, v, keyword="resources")
    nr = opts.get("num_returns")
    if nr in ("dynamic", "streaming"):
        raise NotImplementedError(f"num_returns={nr!r} (generator tasks) is not implemented by "
                                  "Torus")
    if nr is not None and (isinstance(nr, bool) or not isinstance(nr, int) or nr < 0):
        raise ValueError(f"The keyword 'num_returns' accepts 0 or a positive integer, got {nr!r}")
    for k in ("fallback_strategy", "tensor_transport", "_generator_backpressure_num_objects"):
        if opts.get(k) is not None:
            raise NotImplementedError(f"the '{k}' option is not implemented by Torus")
    if opts.get("concurrency_groups") or opts.get("concurrency_group"):
        raise NotImplementedError("concurrency groups are not implemented by Torus")
    if opts.get("object_store_memory") is not None:
        raise NotImplementedError("the 'object_store_memory' option is not implemented by Torus")
    if opts.get("allow_out_of_order_execution"):
        raise NotImplementedError("allow_out_of_order_execution is not implemented by Torus")
    lt = opts.get("lifetime")
    if lt not in (None, "detached", "non_detached"):
        raise ValueError("actor `lifetime` argument must be one of 'detached', "
                         "'non_detached' and 'None'.")


# Amounts are kept in units of 1/10000 (Ray's RESOURCE_UNIT_SCALING): a finer fraction is lost.
_RESOURCE_UNIT_SCALING = 10000


def check_quantity(name: str, quantity: Any, keyword: str) -> None:
    """Ray's rule for one resource amount (num_cpus, num_gpus, memory, or a `resources` entry),
    applied when the options are given (@remote, .options()), not when the work runs.

    Raises TypeError for a non-number and ValueError, with Ray's messages, for a negative amount
    or a fraction finer than 0.0001; NaN and infinite amounts (which Ray lets through to a
    conversion error) raise ValueError too. An amount no node has is valid: the work waits as
    infeasible demand, as in Ray.

    >>> check_quantity("num_cpus", -1, keyword="num_cpus")
    Traceback (most recent call last):
    ValueError: The quantity of resource num_cpus cannot be negative
    """
    if not isinstance(quantity, numbers.Real):
        raise TypeError(f"The type of keyword '{keyword}' must be a number (int or float), but "
                        f"received type {type(quantity)}" +
                        (f" for resource {name}" if keyword != name else ""))
    value = float(quantity)
    if math.isnan(value):
        raise ValueError(f"The quantity of resource {name} cannot be NaN")
    if value < 0:
        raise ValueError(f"The quantity of resource {name} cannot be negative")
    if math.isinf(value):
        raise ValueError(f"The quantity of resource {name} cannot be infinite")
    if value != 0.0 and int(value * _RESOURCE_UNIT_SCALING) == 0:
        raise ValueError(f"The precision of the fractional quantity of resource {name} cannot "
                         "go beyond 0.0001")


def resources(opts: Dict[str, Any], default_cpus: Optional[float]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    cpus = opts.get("num_cpus", None)
    if cpus is None:
        cpus = default_cpus
    if cpus is not None:
        out["CPU"] = float(cpus)
    if opts.get("num_gpus"):
        out["GPU"] = float(opts["num_gpus"])
    if opts.get("memory"):
        out["memory"] = float(opts["memory"])
    for k, v in (opts.get("resources") or {}).items():
        out[k] = float(v)
    if opts.get("accelerator_type"):
        out[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
    return out


def _placement(opts: Dict[str, Any]) -> Dict[str, Any]:
    """placement_group_id, bundle_index, label_selector and spread from scheduling_strategy."""
    from torus.util import scheduling_strategies as ss
    from torus.util.placement_group import PlacementGroup
    out: Dict[str, Any] = {"placement_group_id": "", "bundle_index": -1, "label_selector": {}}
    sel = dict(opts.get("label_selector") or {})
    strat = opts.get("scheduling_strategy")
    if strat is None or strat == "DEFAULT":
        pass
    elif strat == "SPREAD":
        out["spread"] = True
    elif isinstance(strat, str):
        raise ValueError(f"invalid scheduling_strategy '{strat}': expected 'DEFAULT', 'SPREAD' "
                         "or a SchedulingStrategy object")
    elif isinstance(strat, ss.PlacementGroupSchedulingStrategy):
        pg = strat.placement_group
        if pg is not None and not (isinstance(pg, PlacementGroup) and pg.is_empty):
            if not isinstance(pg, PlacementGroup):
                raise TypeError("placement_group must be a PlacementGroup")
            idx = strat.placement_group_bundle_index
            if idx < -1 or idx >= pg.bundle_count:
                raise ValueError(f"placement group bundle index {idx} is invalid. Valid "
                                 f"placement group indexes: 0-{pg.bundle_count - 1}")
            out["placement_group_id"] = pg.id.hex()
            out["bundle_index"] = int(idx)
            out["capture_child_tasks"] = bool(strat.placement_group_capture_child_tasks)
    elif isinstance(strat, ss.NodeAffinitySchedulingStrategy):
        if strat._spill_on_unavailable or strat._fail_on_unavailable:
            raise NotImplementedError("NodeAffinitySchedulingStrategy _spill_on_unavailable / "
                                      "_fail_on_unavailable are not implemented by Torus")
        node = strat.node_id
        node_hex = node.hex() if hasattr(node, "hex") and not isinstance(node, str) else str(node)
        if strat.soft:
            alive = {n["NodeID"] for n in _nodes_alive()}
            if node_hex in alive:
                sel["torus.io/node-id"] = node_hex
        else:
            sel["torus.io/node-id"] = node_hex
    elif isinstance(strat, ss.NodeLabelSchedulingStrategy):
        if strat.soft:
            raise NotImplementedError("NodeLabelSchedulingStrategy(soft=...) is not implemented "
                                      "by Torus (hard constraints are)")
        sel.update(strat._to_selector())
    else:
        raise TypeError(f"unknown scheduling_strategy {strat!r}")
    out["label_selector"] = {str(k): str(v) for k, v in sel.items()}
    return out


_IN_WORKER = worker.in_worker()  # only work inside a task or actor can be captured into a group


def captured(opts: Dict[str, Any], core_opts: Dict[str, Any]) -> Dict[str, Any]:
    """core_opts for work submitted inside a task or actor scheduled with
    placement_group_capture_child_tasks: work without a scheduling strategy of its own goes into
    the same group (any bundle) and captures its own children too, as in Ray."""
    if opts.get("scheduling_strategy") is not None or not _IN_WORKER:
        return core_opts
    pg = worker.core().capture_group()
    if not pg:
        return core_opts
    return dict(core_opts, placement_group_id=pg, bundle_index=-1, capture_child_tasks=True)


def _nodes_alive():
    import torus
    return [n for n in torus.nodes() if n.get("Alive")]


def task_options(opts: Dict[str, Any], name: str) -> Dict[str, Any]:
    o: Dict[str, Any] = {
        "name": opts.get("name") or name,
        "resources": resources(opts, 1.0),
        "max_retries": int(opts.get("max_retries", 3) if opts.get("max_retries") is not None
                           else 3),
        "retry_exceptions": _retry_exceptions(opts.get("retry_exceptions", False)),
        "serialized_runtime_env": worker.runtime_env_json(opts.get("runtime_env"),
                                                          f"{name}.options"),
    }
    o.update(_placement(opts))
    _num_returns(opts, o)
    return o


def _num_returns(opts: Dict[str, Any], o: Dict[str, Any]) -> None:
    nr = opts.get("num_returns")
    if nr is not None and nr > 1:
        o["num_returns"] = nr


_ref_cls = None


def _object_ref_cls():
    """torus.object_ref.ObjectRef, imported on first use (it imports this package)."""
    global _ref_cls
    if _ref_cls is None:
        from torus.object_ref import ObjectRef
        _ref_cls = ObjectRef
    return _ref_cls


def return_refs(oid: str, num_returns):
    """What .remote() gives for a submitted task whose first return is `oid`: one ObjectRef,
    a list of num_returns of them, or None for num_returns=0 (as in Ray)."""
    ObjectRef = _object_ref_cls()
    if num_returns is None or num_returns == 1:
        return ObjectRef(oid)
    if num_returns == 0:  # the task runs; its (single, hidden) return is dropped at once
        ObjectRef(oid)
        return None
    return [ObjectRef(i) for i in worker.core().return_ids(oid, num_returns)]


def _retry_exceptions(v) -> bool:
    if isinstance(v, (list, tuple)):
        raise NotImplementedError("retry_exceptions=[exception classes] is not implemented by "
                                  "Torus (True or False is)")
    return bool(v)


def actor_options(opts: Dict[str, Any], class_name: str, is_async: bool) -> Dict[str, Any]:
    lifetime = opts.get("lifetime")
    mc = opts.get("max_concurrency")
    if mc is None:
        mc = 1000 if is_async else 1
    if mc < 1:
        raise ValueError("max_concurrency must be >= 1")
    ns = opts.get("namespace")
    if ns is not None and not opts.get("name"):
        raise ValueError("The actor namespace can only be set for a named actor.")
    o: Dict[str, Any] = {
        "name": opts.get("name") or "",
        "ray_namespace": ns or "",
        "resources": resources(opts, None),
        "max_restarts": int(opts.get("max_restarts") or 0),
        "max_task_retries": int(opts.get("max_task_retries") or 0),
        "max_concurrency": int(mc),
        "detached": lifetime == "detached",
        "lifetime_set": lifetime is not None,
        "serialized_runtime_env": worker.runtime_env_json(opts.get("runtime_env"),
                                                          f"{class_name}.options"),
        "class_name": class_name,
    }
    o.update(_placement(opts))
    return o


def method_options(opts: Dict[str, Any], name: str) -> Dict[str, Any]:
    o = {
        "name": opts.get("name") or name,
        "max_retries": int(opts.get("max_task_retries") or 0),
        "retry_exceptions": _retry_exceptions(opts.get("retry_exceptions", False)),
    }
    _num_returns(opts, o)
    return o
