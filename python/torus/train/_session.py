"""The worker side of a training run: what ``train.report``, ``train.get_checkpoint`` and
``train.get_context`` see inside ``train_loop_per_worker``.

One session per worker process (set by the worker actor before the loop starts). ``report`` is
a barrier across the group, as in Ray: it returns once every rank made the same report, after
the checkpoint (if any rank passed one) is complete under the run directory.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, Optional

from torus.train._checkpoint import Checkpoint, checkpoint_dir


class TrainContext:
    """Ray Train's ``TrainContext``: where this worker stands in the group."""

    def __init__(self, info: Dict[str, Any]):
        self._info = info

    def get_world_size(self) -> int:
        return self._info["world_size"]

    def get_world_rank(self) -> int:
        return self._info["world_rank"]

    def get_local_rank(self) -> int:
        return self._info["local_rank"]

    def get_local_world_size(self) -> int:
        return self._info["local_world_size"]

    def get_node_rank(self) -> int:
        return self._info["node_rank"]

    def get_experiment_name(self) -> str:
        return self._info["name"]

    def get_storage_path(self) -> str:
        """The run directory (Torus: checkpoints and state live here)."""
        return self._info["run_path"]

    def get_coordinator_address(self) -> str:
        """host:port of the group's JAX coordinator (rank 0's host); also in
        ``JAX_COORDINATOR_ADDRESS``, which ``jax.distributed.initialize()`` reads."""
        return self._info["coordinator"]

    def get_attempt(self) -> int:
        """How many times the group was restarted before this run of the loop (Torus)."""
        return self._info["attempt"]


class _Session:
    def __init__(self, info: Dict[str, Any], collector):
        self.context = TrainContext(info)
        self.info = info
        self.collector = collector
        self.next_index = info["next_index"]
        p = info.get("checkpoint")
        self.checkpoint: Optional[Checkpoint] = Checkpoint(p) if p else None


_session: Optional[_Session] = None


def _start(info: Dict[str, Any], collector) -> None:
    global _session
    _session = _Session(info, collector)


def _require(what: str) -> _Session:
    if _session is None:
        raise RuntimeError(f"train.{what}() is only available inside train_loop_per_worker "
                           f"of a running trainer")
    return _session


def _jsonable(v):
    try:
        import numpy as np
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, np.ndarray):
            return v.tolist()
    except ImportError:
        pass
    if hasattr(v, "item"):  # jax arrays and other 0-d scalars
        try:
            return v.item()
        except Exception:
            pass
    return str(v)


def report(metrics: Dict[str, Any], checkpoint: Optional[Checkpoint] = None,
           checkpoint_dir_name: Optional[str] = None) -> None:
    """Reports this step's metrics (and optionally a checkpoint directory) from every rank."""
    import torus
    s = _require("report")
    if not isinstance(metrics, dict):
        raise TypeError(f"train.report: metrics must be a dict, got {type(metrics).__name__}")
    metrics = json.loads(json.dumps(metrics, default=_jsonable))
    index = s.next_index
    s.next_index += 1
    has = checkpoint is not None
    if checkpoint_dir_name is not None:
        raise NotImplementedError("train.report(checkpoint_dir_name=...) is not implemented by "
                                  "Torus: checkpoints are named checkpoint_<report number>")
    if has:
        dest = checkpoint_dir(s.info["run_path"], index)
        os.makedirs(dest, exist_ok=True)
        if os.path.abspath(checkpoint.path) != dest:
            shutil.copytree(checkpoint.path, dest, dirs_exist_ok=True)
    any_checkpoint = torus.get(s.collector.report.remote(s.context.get_world_rank(), index,
                                                         metrics, has))
    if any_checkpoint:
        s.checkpoint = Checkpoint(checkpoint_dir(s.info["run_path"], index))


def get_checkpoint() -> Optional[Checkpoint]:
    """The latest complete checkpoint of the run (at a restart: the one it resumes from)."""
    return _require("get_checkpoint").checkpoint


def get_context() -> TrainContext:
    return _require("get_context").context


def get_dataset_shard(dataset_name: Optional[str] = None):
    """This worker's DataIterator of ``datasets[dataset_name]`` given to the trainer (its
    disjoint shard when the dataset is split; Ray's ``ray.train.get_dataset_shard``)."""
    s = _require("get_dataset_shard")
    shards = s.info.get("dataset_shards") or {}
    if dataset_name is None and len(shards) == 1:
        return next(iter(shards.values()))
    if dataset_name not in shards:
        raise KeyError(f"Invalid dataset name: {dataset_name!r}: the trainer was given "
                       f"datasets {sorted(shards)}")
    return shards[dataset_name]
