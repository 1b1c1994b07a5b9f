"""Aggregations for ``Dataset.groupby(...).aggregate(...)`` and the whole-dataset shortcuts
(``ds.sum``, ``ds.mean`` ...): Ray Data's names and result column names ("count()",
"sum(x)", "mean(x)", ...). Each maps to a pyarrow hash aggregation run per partition."""
from __future__ import annotations

from typing import Optional


class AggregateFn:
    """One aggregation: pyarrow's function ``arrow_fn`` over ``on`` named ``name``."""

    def __init__(self, arrow_fn: str, on: Optional[str], name: str, options: Optional[dict] = None,
                 ignore_nulls: bool = True):
        self.arrow_fn = arrow_fn
        self.on = on
        self.name = name
        self.options = options
        self.ignore_nulls = ignore_nulls


def _name(kind: str, on, alias_name) -> str:
    return alias_name or (f"{kind}({on})" if on else f"{kind}()")


class Count(AggregateFn):
    def __init__(self, on: Optional[str] = None, ignore_nulls: bool = False,
                 alias_name: Optional[str] = None):
        super().__init__("count_all" if on is None else "count", on, _name("count", on, alias_name))


class Sum(AggregateFn):
    def __init__(self, on: str = None, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        super().__init__("sum", on, _name("sum", on, alias_name))


class Min(AggregateFn):
    def __init__(self, on: str = None, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        super().__init__("min", on, _name("min", on, alias_name))


class Max(AggregateFn):
    def __init__(self, on: str = None, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        super().__init__("max", on, _name("max", on, alias_name))


class Mean(AggregateFn):
    def __init__(self, on: str = None, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        super().__init__("mean", on, _name("mean", on, alias_name))


class Std(AggregateFn):
    def __init__(self, on: str = None, ddof: int = 1, ignore_nulls: bool = True,
                 alias_name: Optional[str] = None):
        super().__init__("stddev", on, _name("std", on, alias_name), {"ddof": ddof})
