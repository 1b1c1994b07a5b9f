"""Scheduling strategies with Ray's names (`ray.util.scheduling_strategies`)."""
from __future__ import annotations

from typing import Dict, List, Optional, Union


class PlacementGroupSchedulingStrategy:
    """Run the task or actor in a placement group (a bundle, or any: index -1)."""

    def __init__(self, placement_group, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: Optional[bool] = None):
        self.placement_group = placement_group
        self.placement_group_bundle_index = placement_group_bundle_index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks


class NodeAffinitySchedulingStrategy:
    """Run on the node with this id (hex); soft=True: elsewhere when it is gone."""

    def __init__(self, node_id, soft: bool, _spill_on_unavailable: bool = False,
                 _fail_on_unavailable: bool = False):
        self.node_id = node_id
        self.soft = soft
        self._spill_on_unavailable = _spill_on_unavailable
        self._fail_on_unavailable = _fail_on_unavailable


class _LabelMatchExpressionOperator:
    def __init__(self, values=None):
        self.values = list(values or [])


class In(_LabelMatchExpressionOperator):
    def __init__(self, *values):
        _check_values(values)
        super().__init__(values)


class NotIn(_LabelMatchExpressionOperator):
    def __init__(self, *values):
        _check_values(values)
        super().__init__(values)


class Exists(_LabelMatchExpressionOperator):
    pass


class DoesNotExist(_LabelMatchExpressionOperator):
    pass


def _check_values(values):
    if not values:
        raise ValueError("The variadic parameter of the In/NotIn operator must be a non-empty "
                         "tuple: e.g. In('value1', 'value2').")
    for v in values:
        if not isinstance(v, str):
            raise ValueError(f"The type of the value in In/NotIn must be str, got {type(v)}")


LabelMatchExpressionsT = Dict[str, Union[In, NotIn, Exists, DoesNotExist]]


class NodeLabelSchedulingStrategy:
    """Run on a node whose labels match `hard` (translated to a label selector)."""

    def __init__(self, hard: LabelMatchExpressionsT, *, soft: LabelMatchExpressionsT = None):
        self.hard = hard or {}
        self.soft = soft or {}
        if not self.hard and not self.soft:
            raise ValueError("The `hard` and `soft` parameter of NodeLabelSchedulingStrategy "
                             "cannot both be empty.")
        for k, op in {**self.hard, **self.soft}.items():
            if not isinstance(k, str):
                raise ValueError(f"The key of the label must be str, got {type(k)}")
            if not isinstance(op, _LabelMatchExpressionOperator):
                raise ValueError(f"The operator of label '{k}' must be In, NotIn, Exists or "
                                 f"DoesNotExist, got {op!r}")

    def _to_selector(self) -> Dict[str, str]:
        out = {}
        for k, op in self.hard.items():
            if isinstance(op, In):
                out[k] = op.values[0] if len(op.values) == 1 else f"in({','.join(op.values)})"
            elif isinstance(op, NotIn):
                out[k] = (f"!{op.values[0]}" if len(op.values) == 1
                          else f"!in({','.join(op.values)})")
            elif isinstance(op, Exists):
                out[k] = "exists()"
            elif isinstance(op, DoesNotExist):
                out[k] = "!exists()"
        return out


SchedulingStrategyT = Union[None, str, PlacementGroupSchedulingStrategy,
                            NodeAffinitySchedulingStrategy, NodeLabelSchedulingStrategy]

__all__: List[str] = ["PlacementGroupSchedulingStrategy", "NodeAffinitySchedulingStrategy",
                      "NodeLabelSchedulingStrategy", "In", "NotIn", "Exists", "DoesNotExist"]
