"""TPU slices (Ray 2.60's `ray.util.tpu`), backed by Torus's one-step slice reservation.

`slice_placement_group` asks the head for whole slices in one decision (all hosts of the slice,
or nothing: docs/tpu.md §6); there are no head placement groups to race for a slice, so
`head_placement_groups` is empty and `release_head_pgs` has nothing to do.
"""
from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from torus._private import worker
from torus.util.placement_group import (PlacementGroup, _create,
                                        remove_placement_group)
from torus.util.scheduling_strategies import PlacementGroupSchedulingStrategy

logger = logging.getLogger(__name__)

DEFAULT_MEGASCALE_PORT = "8081"
DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S = 600.0
VALID_TPU_TYPES = ("v2", "v3", "v4", "v5p", "v5litepod", "v6e", "v7x")
TPU_SLICE_NAME_LABEL = "ray.io/tpu-slice-name"

# docs/tpu.md §2: cores per chip, chips per host.
_CORES = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1, "v7x": 2}
_2D_LITE = ("1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16")
_V7X = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
        "8x16x16")


def _normalize_version(v: str) -> str:
    s = v.strip().lower()
    s = re.sub(r"^tpu-?", "", s)
    s = re.sub(r"-\d+$", "", s)
    if s.startswith("7x"):
        s = "v" + s
    if s == "v5e":
        s = "v5litepod"
    if s not in VALID_TPU_TYPES:
        raise ValueError(f"Invalid accelerator_type '{v}'")
    return s


def get_tpu_version_from_type(accelerator_type: str) -> str:
    """"TPU-V6E" -> "v6e"."""
    try:
        return _normalize_version(accelerator_type)
    except ValueError:
        raise ValueError(f"Invalid accelerator_type: {accelerator_type}. Must be one of "
                         f"{list(VALID_TPU_TYPES)} or start with 'TPU-' followed by a valid "
                         f"type.") from None


def _dims(topology: str) -> List[int]:
    if not re.fullmatch(r"\d+(x\d+){1,2}", topology or ""):
        raise ValueError(f"Invalid topology '{topology}'")
    return [int(x) for x in topology.split("x")]


def is_valid_topology(version: str, topology: str) -> bool:
    try:
        d = _dims(topology)
    except ValueError:
        return False
    if version in ("v5litepod", "v6e"):
        return topology in _2D_LITE
    if version in ("v2", "v3"):
        ok = ("4x4", "4x8", "8x8", "8x16", "16x16") + (("16x32", "32x32") if version == "v3"
                                                        else ())
        return topology in ok
    if version == "v7x":
        return topology in _V7X
    if len(d) != 3:
        return False
    if topology in ("2x2x1", "2x2x2", "2x2x4", "2x4x4"):
        return True
    a, b, c = d
    if version == "v4":
        return a in (4, 8, 12) and b in (4, 8, 12) and c in (4, 8, 12, 16)
    if version == "v5p":
        return a in (4, 8, 12, 16) and b in (4, 8, 12, 16) and c in range(4, 25, 4)
    return False


def get_num_chips_from_topology(topology: str) -> int:
    return math.prod(_dims(topology))


def get_chips_per_host(topology: str, accelerator_version: str) -> int:
    v = _normalize_version(accelerator_version)
    if v in ("v5litepod", "v6e"):
        return {"1x1": 1, "2x2": 4, "2x4": 8}.get(topology, 4)
    return 4


def infer_tpu_pod_type_from_topology(topology: str, accelerator_type: str) -> str:
    v = _normalize_version(accelerator_type)
    return f"{v}-{get_num_chips_from_topology(topology) * _CORES[v]}"


def get_tpu_resource_per_chip() -> int:
    return 1


# ---- node-local helpers ------------------------------------------------------------------

def get_current_pod_name() -> Optional[str]:
    """The TPU slice (pod) this process's host belongs to, or None."""
    return os.environ.get("TPU_NAME") or None


def get_current_pod_worker_count() -> Optional[int]:
    """Hosts in this process's TPU pod, or None when not on a TPU pod."""
    if not get_current_pod_name():
        return None
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if hosts:
        return len([h for h in hosts.split(",") if h])
    topo, typ = os.environ.get("TPU_TOPOLOGY", ""), os.environ.get("TPU_ACCELERATOR_TYPE", "")
    try:
        v = _normalize_version(typ)
        return max(1, get_num_chips_from_topology(topo) // get_chips_per_host(topo, v))
    except ValueError:
        return 1


def get_num_tpu_chips_on_node() -> int:
    """TPU chips of this node (its TPU resource), 0 when none."""
    if worker.is_initialized():
        try:
            node = dict(worker.core().context()).get("node_id")
            for n in worker.core().nodes():
                if n.get("node_id") == node:
                    return int((n.get("total") or {}).get("TPU", 0))
        except Exception:
            pass
    for var in ("TORUS_TPU_CHIPS",):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    try:
        return len([d for d in os.listdir("/dev") if re.fullmatch(r"accel\d+", d)])
    except OSError:
        return 0


def get_tpu_coordinator_env_vars(coordinator_address: str, num_slices: int, slice_id: int,
                                 coordinator_port: str = DEFAULT_MEGASCALE_PORT
                                 ) -> Dict[str, str]:
    """The MEGASCALE_* variables of multislice coordination."""
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": coordinator_address,
        "MEGASCALE_PORT": str(coordinator_port),
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }


def get_tpu_worker_resources(topology: str, accelerator_type: str,
                             resources_per_worker: Optional[Dict[str, float]] = None,
                             num_slices: int = 1, chips_per_vm: Optional[int] = None,
                             tpu_resource_per_chip: Optional[int] = None
                             ) -> Tuple[int, Dict[str, float]]:
    """(number of workers, resources of one worker) for num_slices slices."""
    per_chip = tpu_resource_per_chip or get_tpu_resource_per_chip()
    if per_chip <= 0:
        raise ValueError("`tpu_resource_per_chip` must be a positive integer.")
    version = get_tpu_version_from_type(accelerator_type)
    vm = chips_per_vm if chips_per_vm is not None else get_chips_per_host(topology, version)
    if vm <= 0:
        raise ValueError("chips_per_vm must be positive.")
    vm *= per_chip
    per_slice = get_num_chips_from_topology(topology) * per_chip
    total = per_slice * num_slices
    res = dict(resources_per_worker or {})
    res.setdefault("CPU", 1)
    res.setdefault("TPU", vm)
    tpw = res["TPU"]
    if tpw <= 0:
        raise ValueError("TPU resources must be positive.")
    if total % tpw != 0:
        raise ValueError(f"Total TPU resources ({total}) not divisible by TPUs requested per "
                         f"worker ({tpw}).")
    if per_slice % tpw != 0:
        raise ValueError(f"The requested resources per worker ({tpw} TPU devices) do not "
                         f"divide evenly into the TPU devices available per slice "
                         f"({per_slice}). uneven distribution of TPU across bundles is not "
                         f"supported.")
    return int(total // tpw), res


def get_tpu_num_slices_for_workers(topology: str, accelerator_type: str, num_workers: int,
                                   resources_per_worker=None, tpu_resource_per_chip=None) -> int:
    if not topology or not accelerator_type:
        return 1
    try:
        per_slice, _ = get_tpu_worker_resources(topology, accelerator_type, resources_per_worker,
                                                1, tpu_resource_per_chip=tpu_resource_per_chip)
        return max(1, math.ceil(num_workers / per_slice)) if per_slice else 1
    except Exception:
        return 1


def _slice_counts(topology: str, version: str, chips_per_vm: int = 0, slice_name: str = ""):
    worker.ensure_initialized()
    try:
        r = worker.core().query_slices(topology, version, chips_per_vm, slice_name)
    except Exception as e:
        raise worker.map_core_error(e) from None
    return dict(r)


def get_num_tpu_slices(topology: str, accelerator_type: str) -> int:
    """Intact slices of this shape in the cluster."""
    return int(_slice_counts(topology, _normalize_version(accelerator_type)).get("intact", 0))


def get_num_ready_tpu_slices(topology: str, accelerator_type: str) -> int:
    """Slices of this shape that are intact and idle (could be reserved now)."""
    return int(_slice_counts(topology, _normalize_version(accelerator_type)).get("ready", 0))


def get_tpu_slice_name_from_node(node: Dict[str, Any]) -> Optional[str]:
    labels = node.get("Labels", {}) or {}
    return labels.get(TPU_SLICE_NAME_LABEL) or labels.get("torus.io/tpu-slice-name")


def get_tpu_nodes_for_slice(slice_name: str, nodes=None) -> List[Dict[str, Any]]:
    import torus
    if nodes is None:
        if not worker.is_initialized():
            return []
        nodes = torus.nodes()
    return [n for n in nodes if n.get("Alive") and get_tpu_slice_name_from_node(n) == slice_name]


# ---- slice reservations ------------------------------------------------------------------

class SlicePlacementGroup:
    """A reservation of num_slices whole TPU slices, as one placement group.

    Bundles are numbered slice by slice, host by host (docs/tpu.md §6).
    """

    def __init__(self, topology: str, accelerator_version: str,
                 resources_per_bundle: Optional[Dict[str, float]] = None,
                 strategy: str = "SPREAD", name: str = "", lifetime: Optional[str] = None,
                 num_slices: int = 1, chips_per_vm: Optional[int] = None,
                 head_reservation_timeout_s: Optional[float] =
                 DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
                 bundle_label_selector: Optional[List[Dict[str, str]]] = None,
                 pg_per_slice: bool = False, tpu_resource_per_chip: Optional[int] = None):
        if pg_per_slice:
            raise NotImplementedError("slice_placement_group(pg_per_slice=True) is not "
                                      "implemented by Torus (one placement group reserves "
                                      "all slices atomically)")
        if tpu_resource_per_chip not in (None, 1):
            raise NotImplementedError("tpu_resource_per_chip other than 1 is not implemented "
                                      "by Torus")
        if num_slices < 1:
            raise ValueError("num_slices must be >= 1")
        self._managed_pgs: List[PlacementGroup] = []
        self._pg_per_slice = False
        self._topology = topology.strip().lower()
        self._accelerator_version = get_tpu_version_from_type(accelerator_version.strip())
        self._num_slices = num_slices
        self._tpu_resource_per_chip = 1
        if chips_per_vm is not None and chips_per_vm <= 0:
            raise ValueError("chips_per_vm must be positive.")
        if not is_valid_topology(self._accelerator_version, self._topology):
            raise ValueError(f"Invalid accelerator topology: '{self._topology}' for "
                             f"accelerator version: '{self._accelerator_version}'")
        self._num_bundles, self._bundle_resources = get_tpu_worker_resources(
            self._topology, self._accelerator_version, resources_per_bundle, num_slices,
            chips_per_vm)
        self._chips_per_host = (chips_per_vm if chips_per_vm is not None
                                else get_chips_per_host(self._topology,
                                                        self._accelerator_version))
        total = get_num_chips_from_topology(self._topology)
        self._num_hosts = max(1, total // self._chips_per_host) * num_slices
        user_sel = list(bundle_label_selector or [])
        if user_sel and len(user_sel) != self._num_bundles:
            raise ValueError(f"bundle_label_selector length ({len(user_sel)}) must match the "
                             f"number of bundles ({self._num_bundles}).")
        self._user_selector = [dict(s or {}) for s in user_sel]
        timeout_ms = -1 if head_reservation_timeout_s is None else int(
            head_reservation_timeout_s * 1000)
        bundles = [{k: float(v) for k, v in self._bundle_resources.items()}
                   for _ in range(self._num_bundles)]
        pg = _create(bundles, strategy, name, lifetime, self._user_selector or None,
                     slice_topology=self._topology, slice_version=self._accelerator_version,
                     num_slices=num_slices, chips_per_vm=chips_per_vm or 0,
                     slice_timeout_ms=timeout_ms)
        self._managed_pgs = [pg]

    @property
    def tpu_resource_per_chip(self) -> int:
        return self._tpu_resource_per_chip

    @property
    def slice_placement_group(self) -> Optional[PlacementGroup]:
        return self._managed_pgs[0] if self._managed_pgs else None

    @property
    def placement_group(self) -> Optional[PlacementGroup]:
        return self.slice_placement_group

    @property
    def slice_placement_groups(self) -> List[PlacementGroup]:
        raise ValueError("pg_per_slice=False, use `slice_placement_group` instead.")

    @property
    def chips_per_host(self) -> int:
        return self._chips_per_host

    @property
    def devices_per_host(self) -> int:
        return self._chips_per_host * self._tpu_resource_per_chip

    @property
    def num_hosts(self) -> int:
        return self._num_hosts

    @property
    def num_bundles(self) -> int:
        return self._num_bundles

    @property
    def topology(self) -> str:
        return self._topology

    @property
    def accelerator_version(self) -> str:
        return self._accelerator_version

    @property
    def num_slices(self) -> int:
        return self._num_slices

    @property
    def head_placement_groups(self) -> List[PlacementGroup]:
        return []

    @property
    def slice_names(self) -> List[str]:
        """Torus: the granted slice per slice index ([] while pending)."""
        pg = self.slice_placement_group
        if pg is None:
            return []
        from torus.util.placement_group import _info
        info = _info(pg.id.hex(), "")
        return list((info or {}).get("slice_names") or [])

    @property
    def bundle_label_selector(self) -> List[Dict[str, str]]:
        """Per bundle: the user's selector, plus the granted slice's name once granted."""
        names = self.slice_names if self.slice_placement_group is not None else []
        per_slice = self._num_bundles // self._num_slices
        out = []
        for i in range(self._num_bundles):
            sel = dict(self._user_selector[i]) if self._user_selector else {}
            s = i // per_slice
            if s < len(names) and names[s]:
                sel[TPU_SLICE_NAME_LABEL] = names[s]
            out.append(sel)
        return out

    @property
    def bundle_resources(self) -> Dict[str, float]:
        return self._bundle_resources

    def release_head_pgs(self, slice_index: Optional[int] = None) -> None:
        """Nothing to release: Torus reserves whole slices in one step."""

    def shutdown(self) -> None:
        """Removes the reservation. Idempotent."""
        pgs, self._managed_pgs = self._managed_pgs, []
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                logger.exception("Failed to remove TPU slice placement group %s", pg.id.hex())


def slice_placement_group(topology: str, accelerator_version: str,
                          resources_per_bundle: Optional[Dict[str, float]] = None,
                          num_slices: int = 1, chips_per_vm: Optional[int] = None,
                          pg_per_slice: bool = False,
                          tpu_resource_per_chip: Optional[int] = None,
                          **kwargs) -> SlicePlacementGroup:
    """Reserves num_slices whole TPU slices (asynchronously: wait on .placement_group.ready())."""
    return SlicePlacementGroup(topology=topology, accelerator_version=accelerator_version,
                               resources_per_bundle=resources_per_bundle, num_slices=num_slices,
                               chips_per_vm=chips_per_vm, pg_per_slice=pg_per_slice,
                               tpu_resource_per_chip=tpu_resource_per_chip, **kwargs)


def run_on_slice(fn: Any, *args: Any, topology: Optional[str] = None,
                 accelerator_version: Optional[str] = None,
                 tpu_slice: Optional[SlicePlacementGroup] = None,
                 slice_index: Optional[int] = None, num_slices: int = 1,
                 chips_per_vm: Optional[int] = None,
                 head_reservation_timeout_s: Optional[float] =
                 DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
                 pg_ready_timeout_s: Optional[float] = None, **kwargs: Any):
    """Runs the remote function `fn` once per bundle (host) of a slice; returns the refs."""
    import torus
    if not hasattr(fn, "options"):
        raise TypeError(f"fn must be a @ray.remote-decorated function, but got "
                        f"{type(fn).__name__!r} which has no .options() method.")
    owns = tpu_slice is None
    if slice_index is not None:
        if owns:
            raise ValueError("slice_index can only be used when an existing tpu_slice is "
                             "provided.")
        raise ValueError("slice_index can only be used when tpu_slice was created with "
                         "pg_per_slice=True.")
    if owns:
        if topology is None or accelerator_version is None:
            raise ValueError("topology and accelerator_version are required when tpu_slice is "
                             "not provided.")
        tpu_slice = SlicePlacementGroup(topology=topology,
                                        accelerator_version=accelerator_version,
                                        num_slices=num_slices, chips_per_vm=chips_per_vm,
                                        head_reservation_timeout_s=head_reservation_timeout_s)
    pg = tpu_slice.slice_placement_group
    if pg is None:
        raise ValueError("The provided tpu_slice has already been shut down. Create a new "
                         "SlicePlacementGroup or pass tpu_slice=None to reserve one "
                         "automatically.")
    tpu_per_bundle = tpu_slice.bundle_resources.get("TPU", tpu_slice.devices_per_host)
    ready, _ = torus.wait([pg.ready()], num_returns=1, timeout=pg_ready_timeout_s)
    if not ready:
        if owns:
            tpu_slice.shutdown()
        raise TimeoutError(f"TPU slice placement group was not ready within "
                           f"{pg_ready_timeout_s}s. Ensure your cluster has sufficient TPU "
                           f"resources available.")
    try:
        torus.get(ready)
    except Exception:
        if owns:
            tpu_slice.shutdown()
        raise
    return [fn.options(num_cpus=0, resources={"TPU": tpu_per_bundle},
                       scheduling_strategy=PlacementGroupSchedulingStrategy(
                           placement_group=pg, placement_group_bundle_index=i)
                       ).remote(*args, **kwargs)
            for i in range(tpu_slice.num_bundles)]


dispatch = run_on_slice
