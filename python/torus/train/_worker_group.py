"""One attempt of a training run: the reservation, one worker actor per bundle, the report
collector, the loop running on every worker, and the teardown.

Reservation: with ``use_tpu`` whole slices of ``topology`` in one atomic step (torus.util.tpu:
every host of each slice or nothing), rank i on bundle i (slice by slice, host by host, so rank
0 is worker 0 of the first slice: the JAX coordinator); otherwise an ordinary placement group.
The group is torn down whole: every actor killed and the reservation removed, so a restart
reserves a whole slice again (the same one or another).

THREADS: the driver's thread that called fit(); the collector actor runs ``report`` calls on
its own threads (one per rank blocked in the barrier).
"""
from __future__ import annotations

import glob
import inspect
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torus
from torus.train._config import RunConfig, ScalingConfig
from torus.util.placement_group import placement_group, remove_placement_group
from torus.util.scheduling_strategies import PlacementGroupSchedulingStrategy

WAIT_NOTE_S = 30.0


@torus.remote(num_cpus=0)
class _ReportCollector:
    """The barrier of ``train.report``: a report completes when every rank made it."""

    def __init__(self, world: int):
        self._world = world
        self._cv = threading.Condition()
        self._pending: Dict[int, Dict[int, Tuple[dict, bool]]] = {}
        self._complete: Dict[int, bool] = {}   # index -> some rank passed a checkpoint
        self._done: List[Tuple[int, dict, bool]] = []

    def report(self, rank: int, index: int, metrics: dict, has_checkpoint: bool) -> bool:
        with self._cv:
            got = self._pending.setdefault(index, {})
            got[rank] = (metrics, has_checkpoint)
            if len(got) == self._world:
                any_ckpt = any(h for _, h in got.values())
                self._done.append((index, got.get(0, next(iter(got.values())))[0], any_ckpt))
                self._complete[index] = any_ckpt
                del self._pending[index]
                self._cv.notify_all()
            else:
                self._cv.wait_for(lambda: index in self._complete)
            return self._complete[index]

    def take(self) -> List[Tuple[int, dict, bool]]:
        with self._cv:
            out, self._done = self._done, []
            return out


def required_parameters(fn: Callable) -> int:
    """Positional parameters without a default (*args counts as one), as Ray counts them."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.VAR_POSITIONAL)
    return sum(1 for p in inspect.signature(fn).parameters.values()
               if p.default is inspect.Parameter.empty and p.kind in kinds)


def _host_has_tpu() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


@torus.remote(num_cpus=0)
class _TrainWorker:
    """Runs train_loop_per_worker once, in its own process on its bundle's host."""

    def where(self) -> Dict[str, Any]:
        node = os.environ.get("TORUS_NODE_ADDRESS", "")
        ip = node.rsplit(":", 1)[0] if node else torus.util.get_node_ip_address()
        with socket.socket() as s:  # a free port for the JAX coordinator (rank 0)
            s.bind((ip, 0))
            port = s.getsockname()[1]
        return {"node_id": torus.get_runtime_context().get_node_id(), "ip": ip, "port": port}

    def setup(self, info: Dict[str, Any], collector) -> bool:
        """False when this host does not see the run directory the driver created."""
        from torus.train import _session
        marker = os.path.join(info["run_path"], ".torus_driver_" + info["marker"])
        if not os.path.exists(marker):
            return False
        os.environ["JAX_COORDINATOR_ADDRESS"] = info["coordinator"]
        os.environ["TORUS_COORDINATOR_ADDRESS"] = info["coordinator"]
        os.environ["TORUS_NUM_PROCESSES"] = str(info["world_size"])
        os.environ["TORUS_PROCESS_ID"] = str(info["world_rank"])
        # Several slices: libtpu's multislice (DCN) coordination, as Ray's JaxTrainer sets it.
        os.environ.update(info.get("megascale", {}))
        _session._start(info, collector)
        if info["use_tpu"]:
            # As Ray's JaxTrainer: on TPU hosts JAX is set to TPU and its distributed runtime
            # started before the loop. A simulated host (no TPU device) keeps the user's
            # platform, and the loop initialises jax.distributed itself (TrainContext values).
            platforms = os.environ.get("JAX_PLATFORMS", "").lower()
            if not platforms and _host_has_tpu():
                os.environ["JAX_PLATFORMS"] = platforms = "tpu"
            if "tpu" in platforms.split(","):
                import jax
                jax.distributed.initialize(info["coordinator"], info["world_size"],
                                           info["world_rank"])
        return True

    def run(self, fn: Callable, config: Optional[dict]) -> None:
        # As Ray: a loop with one required argument gets the config ({} when none was given).
        if required_parameters(fn) == 1:
            fn(config if config is not None else {})
        else:
            fn()


class WorkerGroup:
    def __init__(self, scaling: ScalingConfig, run: RunConfig, name: str, run_path: str,
                 log: Callable[[str], None], datasets: Optional[Dict[str, Any]] = None,
                 data_config: Any = None):
        self.datasets = datasets or {}
        self.data_config = data_config
        self.scaling = scaling
        self.run_cfg = run
        self.name = name
        self.run_path = run_path
        self.log = log
        self.workers: List[Any] = []
        self.collector = None
        self._slice = None
        self._pg = None
        self._runs: List[Any] = []
        self._marker = ""

    # ------------------------------------------------------------------ reservation
    def _bundles(self) -> Tuple[Any, List[Dict[str, float]]]:
        s = self.scaling
        if s.use_tpu:
            from torus.util import tpu
            version = tpu.get_tpu_version_from_type(s.accelerator_type)
            slices = tpu.get_tpu_num_slices_for_workers(s.topology, version, s.num_workers,
                                                         s.resources_per_worker)
            self._slice = tpu.SlicePlacementGroup(
                topology=s.topology, accelerator_version=version,
                resources_per_bundle=s.resources_per_worker, num_slices=slices,
                head_reservation_timeout_s=None)
            if self._slice.num_bundles != s.num_workers:
                n = self._slice.num_bundles
                self._slice.shutdown()
                self._slice = None
                raise ValueError(f"ScalingConfig.num_workers={s.num_workers} does not fill whole "
                                 f"{s.topology} {version} slices: {slices} slice(s) of "
                                 f"{s.resources_per_worker or 'one host'} per worker make {n} "
                                 f"workers")
            pg = self._slice.placement_group
            return pg, [dict(self._slice.bundle_resources)] * s.num_workers
        per = dict(s.resources_per_worker or {"CPU": 1.0})
        if s.use_gpu:
            per.setdefault("GPU", 1.0)
        bundles = [per] * s.num_workers
        self._pg = placement_group(bundles, strategy=s.placement_strategy)
        return self._pg, bundles

    def reserve(self) -> Tuple[Any, List[Dict[str, float]]]:
        pg, bundles = self._bundles()
        start = time.monotonic()
        while True:
            ready, _ = torus.wait([pg.ready()], num_returns=1, timeout=WAIT_NOTE_S)
            if ready:
                torus.get(ready[0])
                return pg, bundles
            self.log(f"still waiting for {self._describe()} after "
                     f"{time.monotonic() - start:.0f} s")

    def _describe(self) -> str:
        s = self.scaling
        if s.use_tpu:
            return f"{s.num_workers} host(s) of whole {s.topology} {s.accelerator_type} slice(s)"
        return f"{s.num_workers} worker(s) of {s.resources_per_worker or {'CPU': 1}}"

    # ------------------------------------------------------------------ workers
    def start(self, attempt: int, next_index: int, checkpoint: Optional[str]) -> None:
        import uuid
        self._marker = uuid.uuid4().hex
        with open(os.path.join(self.run_path, ".torus_driver_" + self._marker), "w"):
            pass
        pg, bundles = self.reserve()
        world = len(bundles)
        env = self.run_cfg.worker_runtime_env
        for i, b in enumerate(bundles):
            opts: Dict[str, Any] = {
                "num_cpus": b.get("CPU", 0.0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i)}
            if b.get("GPU"):
                opts["num_gpus"] = b["GPU"]
            other = {k: v for k, v in b.items() if k not in ("CPU", "GPU")}
            if other:
                opts["resources"] = other
            if env:
                opts["runtime_env"] = env
            self.workers.append(_TrainWorker.options(**opts).remote())
        # The collector on the driver's node: it outlives any slice host the group loses.
        from torus.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        here = torus.get_runtime_context().get_node_id()
        self.collector = _ReportCollector.options(
            max_concurrency=world + 4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote(world)
        where = torus.get([w.where.remote() for w in self.workers])
        coordinator = f"{where[0]['ip']}:{where[0]['port']}"
        node_order: List[str] = []
        for w in where:
            if w["node_id"] not in node_order:
                node_order.append(w["node_id"])
        num_slices = self._slice.num_slices if self._slice is not None else 1
        per_slice = max(1, world // num_slices)
        shards = self._dataset_shards(world)
        setups = []
        for rank, w in enumerate(where):
            same = [r for r, x in enumerate(where) if x["node_id"] == w["node_id"]]
            info = {"world_size": world, "world_rank": rank, "local_rank": same.index(rank),
                    "local_world_size": len(same), "node_rank": node_order.index(w["node_id"]),
                    "name": self.name, "run_path": self.run_path, "coordinator": coordinator,
                    "next_index": next_index, "checkpoint": checkpoint, "attempt": attempt,
                    "use_tpu": self.scaling.use_tpu, "marker": self._marker,
                    "dataset_shards": {k: v[rank] for k, v in shards.items()}}
            if num_slices > 1:
                # Ranks go slice by slice (reserve()): rank 0's host coordinates the slices.
                from torus.util import tpu
                info["megascale"] = tpu.get_tpu_coordinator_env_vars(
                    where[0]["ip"], num_slices, min(rank // per_slice, num_slices - 1))
            setups.append(self.workers[rank].setup.remote(info, self.collector))
        blind = [r for r, ok in enumerate(torus.get(setups)) if not ok]
        if blind:
            from torus.train._controller import _NotRetryable
            raise _NotRetryable(
                f"the run directory {self.run_path} is not visible from the host(s) of rank(s) "
                f"{blind}: RunConfig.storage_path must be a path every host shares")

    def _dataset_shards(self, world: int) -> Dict[str, List[Any]]:
        """Each dataset's iterator per rank (DataConfig): the split ones from one
        streaming_split(world, equal=True), so that every rank gets the same number of rows
        (every host the same number of batches: no collective waits); the others whole."""
        if not self.datasets:
            return {}
        from torus.train._config import DataConfig
        cfg = self.data_config or DataConfig()
        return cfg.shards(self.datasets, world)

    def run(self, fn: Callable, config: Optional[dict],
            on_report: Callable[[int, dict, bool], None]) -> Optional[Tuple[int, Exception]]:
        """Runs the loop on every worker; None when all returned, else (rank, error) of the
        first failure."""
        self._runs = [w.run.remote(fn, config) for w in self.workers]
        rank_of = {r: i for i, r in enumerate(self._runs)}
        pending = list(self._runs)
        while pending:
            done, pending = torus.wait(pending, num_returns=1, timeout=0.5)
            self._drain(on_report)
            for ref in done:
                try:
                    torus.get(ref)
                except Exception as e:  # noqa: BLE001 - the group's failure, reported
                    return rank_of[ref], e
        self._drain(on_report)
        return None

    def _drain(self, on_report) -> None:
        try:
            items = torus.get(self.collector.take.remote(), timeout=60)
        except Exception:  # the collector is gone with its host: nothing more completes
            return
        for index, metrics, has in sorted(items, key=lambda t: t[0]):
            on_report(index, metrics, has)

    def shutdown(self, on_report=None) -> None:
        """Stops every worker and waits (at most 30 s) until their loops are over, so none
        still writes a checkpoint; records the reports that completed meanwhile; then stops
        the collector and releases the reservation."""
        for a in self.workers:
            try:
                torus.kill(a, no_restart=True)
            except Exception:
                pass
        runs = getattr(self, "_runs", [])
        if runs:
            try:
                torus.wait(runs, num_returns=len(runs), timeout=30)
            except Exception:
                pass
        if self.collector is not None:
            if on_report is not None:
                self._drain(on_report)
            try:
                torus.kill(self.collector, no_restart=True)
            except Exception:
                pass
        if getattr(self, "_marker", ""):
            try:
                os.unlink(os.path.join(self.run_path, ".torus_driver_" + self._marker))
            except OSError:
                pass
        self.workers, self.collector, self._runs = [], None, []
        if self._slice is not None:
            self._slice.shutdown()
            self._slice = None
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:
                pass
            self._pg = None
