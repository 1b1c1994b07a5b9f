"""The logical plan of a Dataset: a source followed by operators, immutable (each Dataset
method returns a new plan sharing the old one's prefix).

Sources: ``Read`` (ReadTasks, run lazily) and ``InputBlocks`` (blocks already in the object
store). Operators: ``MapSpec`` (one-to-one, row or batch UDFs, fused into the tasks before
them unless they run on an actor pool), ``Limit``, and ``AllToAll`` (a barrier: repartition,
shuffle, sort, groupby, union, zip; it sees every input block before producing any output).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from torus.data._internal.read_task import ReadTask


@dataclass
class Read:
    name: str
    tasks: List[ReadTask]
    ray_remote_args: Dict[str, Any] = field(default_factory=dict)
    concurrency: Optional[int] = None


@dataclass
class InputBlocks:
    name: str
    refs: List[Any]            # ObjectRefs of blocks
    metas: List[Any]           # their BlockMetadata


@dataclass
class MapSpec:
    """One UDF operator. kind: map_rows | flat_map | filter | map_batches."""
    kind: str
    fn: Any
    name: str
    fn_args: Tuple = ()
    fn_kwargs: Dict[str, Any] = field(default_factory=dict)
    fn_constructor_args: Tuple = ()
    fn_constructor_kwargs: Dict[str, Any] = field(default_factory=dict)
    batch_size: Optional[int] = None
    batch_format: Optional[str] = "default"
    zero_copy_batch: bool = False
    # None: tasks; (min, max): an actor pool (a callable class needs one).
    pool: Optional[Tuple[int, int]] = None
    concurrency: Optional[int] = None      # tasks: at most this many at once
    ray_remote_args: Dict[str, Any] = field(default_factory=dict)

    @property
    def is_class(self) -> bool:
        return isinstance(self.fn, type)


@dataclass
class Limit:
    n: int


@dataclass
class AllToAll:
    """A barrier. ``run(refs, metas, ctx) -> (refs, metas)`` runs on the driver (it submits the
    tasks it needs and waits for them)."""
    name: str
    run: Callable[..., Tuple[List[Any], List[Any]]]


Source = Any   # Read | InputBlocks
Op = Any       # MapSpec | Limit | AllToAll


@dataclass(frozen=True)
class Plan:
    source: Source
    ops: Tuple[Op, ...] = ()

    def with_op(self, op: Op) -> "Plan":
        return Plan(self.source, self.ops + (op,))

    def names(self) -> List[str]:
        return [self.source.name] + [getattr(o, "name", type(o).__name__) for o in self.ops]
