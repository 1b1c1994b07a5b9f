"""Placement groups (Ray's `ray.util.placement_group`), placed atomically by the head."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from torus._private import worker
from torus.object_ref import ObjectRef, id_hex

VALID_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementGroupID:
    def __init__(self, raw):
        self._raw = raw

    def hex(self) -> str:
        return id_hex(self._raw)

    def binary(self) -> bytes:
        return bytes.fromhex(self.hex())

    def is_nil(self) -> bool:
        return not self._raw

    def __eq__(self, o):
        return isinstance(o, PlacementGroupID) and o.hex() == self.hex()

    def __hash__(self):
        return hash(self.hex())

    def __repr__(self):
        return f"PlacementGroupID({self.hex()})"


class PlacementGroup:
    """A handle to a placement group (picklable)."""

    def __init__(self, id, bundle_cache: Optional[List[Dict[str, float]]] = None):
        self.id = id if isinstance(id, PlacementGroupID) else PlacementGroupID(id)
        self.bundle_cache = bundle_cache

    @staticmethod
    def empty() -> "PlacementGroup":
        return PlacementGroup(PlacementGroupID(""), [])

    @property
    def is_empty(self) -> bool:
        return self.id.is_nil()

    def _fill_bundle_cache(self):
        if self.bundle_cache is None:
            info = _info(self.id.hex(), "")
            self.bundle_cache = _spec(info).get("bundles", []) if info else []

    @property
    def bundle_specs(self) -> List[Dict[str, float]]:
        self._fill_bundle_cache()
        return [dict(b) for b in self.bundle_cache]

    @property
    def bundle_count(self) -> int:
        self._fill_bundle_cache()
        return len(self.bundle_cache)

    def ready(self) -> ObjectRef:
        """A ref that becomes ready when the group is created; its value is the group."""
        return _ReadyRef(self)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """True once the group is created within timeout_seconds; False on timeout."""
        worker.ensure_initialized()
        return _wait(self.id.hex(), timeout_seconds)

    def __reduce__(self):
        return (PlacementGroup, (self.id, self.bundle_cache))

    def __eq__(self, o):
        return isinstance(o, PlacementGroup) and o.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"PlacementGroup({self.id.hex()})"


def _wait(pg_id: str, timeout_seconds: Optional[float]) -> bool:
    """Waits for CREATED; the core takes whole seconds, so sub-second waits poll."""
    core = worker.core()
    deadline = None if timeout_seconds is None else time.monotonic() + max(0, timeout_seconds)
    while True:
        if deadline is None:
            step = 3600
        else:
            left = deadline - time.monotonic()
            step = int(left) if left >= 1 else 0
        try:
            if core.wait_placement_group(pg_id, step):
                return True
        except Exception as e:
            raise worker.map_core_error(e) from None
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if step == 0:
            time.sleep(0.01)


class _ReadyRef(ObjectRef):
    """PlacementGroup.ready(): a local future answered by the head (no task, no worker).

    Works with get() (value: the group), wait() and await; cannot be passed to a task.
    """

    __slots__ = ("_pg",)

    def __init__(self, pg: PlacementGroup):
        self._id = "pgready:" + pg.id.hex()
        self._gen = worker.generation()
        self._pg = pg

    def __del__(self):
        pass

    def __reduce__(self):
        raise NotImplementedError("passing PlacementGroup.ready() to a task is not "
                                  "implemented by Torus; pass the PlacementGroup itself")

    def _wait_value(self, timeout: Optional[float]):
        from torus.exceptions import GetTimeoutError
        if not _wait(self._pg.id.hex(), timeout):
            raise GetTimeoutError(f"Get timed out: placement group {self._pg.id.hex()} was not "
                                  f"created within {timeout} s")
        return self._pg

    def _poll(self) -> bool:
        try:
            return bool(worker.core().wait_placement_group(self._pg.id.hex(), 0))
        except Exception:
            return True  # removed: ready, and get() raises

    def hex(self) -> str:
        return self._pg.id.hex()

    def __hash__(self):
        return hash(self._id)

    def __eq__(self, o):
        return isinstance(o, _ReadyRef) and o._id == self._id

    def __repr__(self):
        return f"ObjectRef(placement group {self._pg.id.hex()} ready)"


def _spec(info: Dict[str, Any]) -> Dict[str, Any]:
    s = info.get("spec")
    return dict(s) if isinstance(s, dict) else dict(info)


def _info(pg_id: str, name: str) -> Optional[Dict[str, Any]]:
    try:
        info = worker.core().get_placement_group(pg_id, name)
    except Exception as e:
        raise worker.map_core_error(e) from None
    if not info or not info.get("found", True) or not info.get("id"):
        return None
    return dict(info)


def _validate_bundles(bundles) -> List[Dict[str, float]]:
    if not isinstance(bundles, list) or not bundles:
        raise ValueError("The placement group `bundles` argument must be a list of dictionaries "
                         "and cannot be empty.")
    out = []
    for b in bundles:
        if not isinstance(b, dict):
            raise ValueError(f"The placement group `bundles` argument must be a list of "
                             f"dictionaries, got {b!r}.")
        if not b:
            raise ValueError("Bundles cannot be an empty dictionary or resources with only 0 "
                             f"values. Bundles: {bundles}")
        if all(v == 0 for v in b.values()):
            raise ValueError("Bundles cannot be an empty dictionary or resources with only 0 "
                             f"values. Bundles: {bundles}")
        for k, v in b.items():
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"Bundle resource '{k}' must be a non-negative number, "
                                 f"got {v!r}")
        out.append({str(k): float(v) for k, v in b.items()})
    return out


def _create(bundles, strategy, name, lifetime, bundle_label_selector, *, slice_topology="",
            slice_version="", num_slices=0, chips_per_vm=0, slice_timeout_ms=-1):
    worker.ensure_initialized()
    if strategy not in VALID_STRATEGIES:
        raise ValueError(f"Invalid placement group strategy {strategy}. Supported strategies "
                         f"are: {list(VALID_STRATEGIES)}.")
    if lifetime not in (None, "detached"):
        raise ValueError("The placement group `lifetime` argument must be either `detached` or "
                         f"`None`, got {lifetime!r}")
    sels = [dict(s or {}) for s in (bundle_label_selector or [])]
    if sels and len(sels) != len(bundles):
        raise ValueError(f"Invalid bundle label selector {bundle_label_selector}. The length "
                         f"of `bundle_label_selector` should equal the length of `bundles`.")
    spec = {
        "name": name or "",
        "ray_namespace": worker.current_namespace(),
        "bundles": bundles,
        "strategy": strategy,
        "bundle_selectors": [{str(k): str(v) for k, v in s.items()} for s in sels],
        "detached": lifetime == "detached",
        "slice_topology": slice_topology,
        "slice_version": slice_version,
        "num_slices": int(num_slices),
        "chips_per_vm": int(chips_per_vm),
        "slice_timeout_ms": int(slice_timeout_ms),
    }
    try:
        r = worker.core().create_placement_group(spec)
    except Exception as e:
        raise worker.map_core_error(e) from None
    pg_id = r.get("id") if isinstance(r, dict) else r
    return PlacementGroup(PlacementGroupID(pg_id), [dict(b) for b in bundles])


def placement_group(bundles: List[Dict[str, float]], strategy: str = "PACK", name: str = "",
                    lifetime: Optional[str] = None, _soft_target_node_id: Optional[str] = None,
                    bundle_label_selector: Optional[List[Dict[str, str]]] = None
                    ) -> PlacementGroup:
    """Asynchronously creates a placement group (PENDING until the head places it)."""
    if _soft_target_node_id is not None:
        raise NotImplementedError("placement_group(_soft_target_node_id=...) is not "
                                  "implemented by Torus")
    return _create(_validate_bundles(bundles), strategy, name, lifetime, bundle_label_selector)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    worker.ensure_initialized()
    if not isinstance(placement_group, PlacementGroup):
        raise TypeError("remove_placement_group takes a PlacementGroup")
    try:
        worker.core().remove_placement_group(placement_group.id.hex())
    except Exception as e:
        raise worker.map_core_error(e) from None


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    worker.ensure_initialized()
    if not placement_group_name:
        raise ValueError("Please supply a non-empty value to get_placement_group")
    info = _info("", placement_group_name)
    if info is None or info.get("state") == "REMOVED":
        raise ValueError(f"Failed to look up placement group with name: "
                         f"{placement_group_name}")
    return PlacementGroup(PlacementGroupID(info["id"]), _spec(info).get("bundles"))


def _table_entry(info: Dict[str, Any]) -> Dict[str, Any]:
    spec = _spec(info)
    bundles = spec.get("bundles") or []
    nodes = info.get("bundle_nodes") or []
    return {
        "placement_group_id": id_hex(info.get("id")),
        "name": spec.get("name", ""),
        "bundles": {i: dict(b) for i, b in enumerate(bundles)},
        "bundles_to_node_id": {i: id_hex(n) for i, n in enumerate(nodes) if n},
        "strategy": spec.get("strategy", ""),
        "state": info.get("state", ""),
        "stats": {"scheduling_state": info.get("pending_reason") or info.get("state", "")},
        "is_detached": bool(spec.get("detached", False)),
        "slice_names": list(info.get("slice_names") or []),
        "epoch": info.get("epoch", 0),
    }


def placement_group_table(placement_group: Optional[PlacementGroup] = None) -> Dict[str, Any]:
    worker.ensure_initialized()
    if placement_group is not None:
        info = _info(placement_group.id.hex(), "")
        return _table_entry(info) if info else {}
    try:
        all_ = worker.core().placement_groups()
    except Exception as e:
        raise worker.map_core_error(e) from None
    return {id_hex(i["id"]): _table_entry(dict(i)) for i in all_}


def get_current_placement_group() -> Optional[PlacementGroup]:
    if not worker.is_initialized():
        return None
    p = dict(worker.core().context()).get("placement_group_id")
    return PlacementGroup(PlacementGroupID(p)) if p else None


def check_placement_group_index(placement_group, bundle_index):
    if placement_group is None or placement_group.is_empty:
        return
    if bundle_index < -1 or bundle_index >= placement_group.bundle_count:
        raise ValueError(f"placement group bundle index {bundle_index} is invalid. Valid "
                         f"placement group indexes: 0-{placement_group.bundle_count - 1}")
