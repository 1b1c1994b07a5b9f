"""Ray Train v2's configuration classes (Ray 2.60 names and defaults), as plain dataclasses."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class ScalingConfig:
    """How many workers and what each holds.

    With ``use_tpu=True`` and a ``topology``, the workers are one per host of whole TPU slices
    of that topology (reserved atomically, ``num_workers`` = hosts x slices); otherwise
    ``num_workers`` workers of ``resources_per_worker`` placed by ``placement_strategy``.
    """
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None
    use_tpu: bool = False
    topology: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"ScalingConfig.num_workers must be a positive integer, got "
                             f"{self.num_workers!r}")
        if self.use_gpu and self.use_tpu:
            raise ValueError("ScalingConfig: use_gpu and use_tpu cannot both be set")
        if self.topology and not self.use_tpu:
            raise ValueError("ScalingConfig.topology is set but use_tpu is False")
        if self.use_tpu and not self.topology:
            raise ValueError("ScalingConfig(use_tpu=True) needs a topology (e.g. '4x4'): "
                             "Torus reserves whole slices of it")
        if self.use_tpu and not self.accelerator_type:
            raise ValueError("ScalingConfig(use_tpu=True) needs an accelerator_type (e.g. "
                             "'TPU-V6E')")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"ScalingConfig.placement_strategy must be PACK, SPREAD, "
                             f"STRICT_PACK or STRICT_SPREAD, got {self.placement_strategy!r}")
        for k, v in (self.resources_per_worker or {}).items():
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"ScalingConfig.resources_per_worker[{k!r}] must be a "
                                 f"non-negative number, got {v!r}")


@dataclass
class CheckpointConfig:
    """Which checkpoints to keep: the ``num_to_keep`` latest (None: all), or the best by
    ``checkpoint_score_attribute`` (a reported metric) in ``checkpoint_score_order``."""
    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"

    def __post_init__(self):
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int)
                                             or self.num_to_keep < 1):
            raise ValueError(f"CheckpointConfig.num_to_keep must be None or a positive "
                             f"integer, got {self.num_to_keep!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"CheckpointConfig.checkpoint_score_order must be 'max' or 'min', "
                             f"got {self.checkpoint_score_order!r}")


@dataclass
class FailureConfig:
    """How often the whole worker group is restarted after a failure (-1: without limit)."""
    max_failures: int = 0

    def __post_init__(self):
        if not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise ValueError(f"FailureConfig.max_failures must be an integer >= -1, got "
                             f"{self.max_failures!r}")


@dataclass
class RunConfig:
    """Where the run lives (``storage_path``/``name``) and how it checkpoints and retries.

    ``storage_path`` defaults to ``~/ray_results``; on a cluster of several machines it must be
    a path every host sees (a shared file system)."""
    name: Optional[str] = None
    storage_path: Optional[str] = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    worker_runtime_env: Optional[Dict[str, Any]] = None
    verbose: int = 1

    def __post_init__(self):
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.failure_config is None:
            self.failure_config = FailureConfig()

    def run_path(self, default_name: str) -> str:
        root = self.storage_path or os.path.join(os.path.expanduser("~"), "ray_results")
        return os.path.join(os.path.abspath(os.path.expanduser(root)), self.name or default_name)


class DataConfig:
    """How the trainer's ``datasets`` reach its workers (Ray's ``ray.train.DataConfig``):
    ``datasets_to_split`` ("all", or a list of names) are split across the workers with
    ``streaming_split(num_workers, equal=True)`` (disjoint shards, the same number of rows on
    every worker, each epoch a new pass); the others go whole to every worker.
    ``execution_options`` replaces DataContext's for these datasets."""

    def __init__(self, datasets_to_split: Any = "all", execution_options: Any = None,
                 enable_shard_locality: bool = True):
        if datasets_to_split != "all" and not isinstance(datasets_to_split, (list, tuple)):
            raise TypeError(f"`datasets_to_split` should be a 'all' or a list of strings of "
                            f"dataset names. Received {type(datasets_to_split).__name__} with "
                            f"value {datasets_to_split}.")
        self.datasets_to_split = datasets_to_split
        self.execution_options = execution_options
        self.enable_shard_locality = enable_shard_locality

    def shards(self, datasets: Dict[str, Any], world: int) -> Dict[str, list]:
        """Each dataset's iterator for every rank."""
        from torus.data.context import DataContext
        ctx = DataContext.get_current()
        saved = ctx.execution_options
        if self.execution_options is not None:
            ctx.execution_options = self.execution_options
        try:
            out = {}
            for name, ds in datasets.items():
                split = self.datasets_to_split == "all" or name in self.datasets_to_split
                if split:
                    out[name] = ds.streaming_split(world, equal=True)
                else:
                    out[name] = [ds.iterator() for _ in range(world)]
            return out
        finally:
            ctx.execution_options = saved
