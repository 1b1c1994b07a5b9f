"""DataContext: the knobs of Ray Data that users set (Ray 2.60's names), one per driver process.

``DataContext.get_current()`` returns the process's context; a Dataset captures a copy when it
starts executing, so changes apply to executions that start afterwards. Not thread-safe to
mutate while datasets execute (as in Ray).
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ExecutionResources:
    """Limits for one execution (None: derived from the cluster)."""
    cpu: Optional[float] = None
    gpu: Optional[float] = None
    object_store_memory: Optional[float] = None

    @classmethod
    def for_limits(cls, cpu=None, gpu=None, object_store_memory=None) -> "ExecutionResources":
        return cls(cpu=cpu, gpu=gpu, object_store_memory=object_store_memory)


@dataclass
class ExecutionOptions:
    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)
    # Outputs in the order of the inputs (Torus always keeps the order; the flag is accepted).
    preserve_order: bool = False
    locality_with_output: bool = False
    verbose_progress: bool = False


_lock = threading.Lock()
_current: Optional["DataContext"] = None


@dataclass
class DataContext:
    target_max_block_size: int = 128 * 1024 * 1024
    target_min_block_size: int = 1 * 1024 * 1024
    read_op_min_num_blocks: int = 200
    # The share of the cluster's object store an execution may fill with blocks not yet consumed
    # (when execution_options.resource_limits.object_store_memory is not set).
    object_store_memory_fraction: float = 0.5
    execution_options: ExecutionOptions = field(default_factory=ExecutionOptions)
    enable_progress_bars: bool = True
    enable_operator_progress_bars: bool = True
    max_errored_blocks: int = 0
    # Retries of a read or map task whose worker died (user exceptions are not retried).
    max_task_retries: int = 3
    actor_task_retry_on_errors: bool = False
    use_push_based_shuffle: bool = False
    # Tasks of one operator in flight at most (besides the memory budget).
    max_tasks_in_flight_per_operator: Optional[int] = None
    max_tasks_in_flight_per_actor: int = 2
    # How long an actor of an autoscaling pool may stay idle before it is removed (s).
    actor_pool_idle_timeout_s: float = 2.0

    @staticmethod
    def get_current() -> "DataContext":
        global _current
        with _lock:
            if _current is None:
                _current = DataContext()
            return _current

    @staticmethod
    def _set_current(ctx: "DataContext") -> None:
        global _current
        with _lock:
            _current = ctx

    def copy(self) -> "DataContext":
        return copy.deepcopy(self)
