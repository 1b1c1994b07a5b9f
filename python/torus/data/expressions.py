"""Column expressions (``ray.data.expressions``: ``col``, ``lit``), as Ray 2.60's
``Dataset.filter(expr=...)`` and ``Dataset.with_column(name, expr)`` take them.

An expression is a small tree evaluated over a block with pyarrow.compute: comparisons,
``&``/``|``/``~``, arithmetic (``+ - * / // %``), ``is_null``/``is_not_null``/``is_in``.
Picklable (it travels to the tasks that evaluate it)."""
from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc

_BINARY = {
    "eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal,
    "gt": pc.greater, "ge": pc.greater_equal, "and": pc.and_kleene, "or": pc.or_kleene,
    "add": pc.add, "sub": pc.subtract, "mul": pc.multiply, "truediv": pc.divide,
}


def _floordiv(a, b):
    return pc.floor(pc.divide(pc.cast(a, pa.float64()), pc.cast(b, pa.float64())))


def _mod(a, b):
    return pc.subtract(a, pc.multiply(pc.cast(_floordiv(a, b), pa.int64())
                                      if pa.types.is_integer(_type(a)) else _floordiv(a, b), b))


def _type(x):
    return x.type if hasattr(x, "type") else pa.scalar(x).type


class Expr:
    def _bin(self, op: str, other: Any, swap: bool = False) -> "Expr":
        o = other if isinstance(other, Expr) else LiteralExpr(other)
        return BinaryExpr(op, o, self) if swap else BinaryExpr(op, self, o)

    def __eq__(self, o): return self._bin("eq", o)          # noqa: E704
    def __ne__(self, o): return self._bin("ne", o)          # noqa: E704
    def __lt__(self, o): return self._bin("lt", o)          # noqa: E704
    def __le__(self, o): return self._bin("le", o)          # noqa: E704
    def __gt__(self, o): return self._bin("gt", o)          # noqa: E704
    def __ge__(self, o): return self._bin("ge", o)          # noqa: E704
    def __and__(self, o): return self._bin("and", o)        # noqa: E704
    def __or__(self, o): return self._bin("or", o)          # noqa: E704
    def __add__(self, o): return self._bin("add", o)        # noqa: E704
    def __radd__(self, o): return self._bin("add", o, True)  # noqa: E704
    def __sub__(self, o): return self._bin("sub", o)        # noqa: E704
    def __rsub__(self, o): return self._bin("sub", o, True)  # noqa: E704
    def __mul__(self, o): return self._bin("mul", o)        # noqa: E704
    def __rmul__(self, o): return self._bin("mul", o, True)  # noqa: E704
    def __truediv__(self, o): return self._bin("truediv", o)  # noqa: E704
    def __floordiv__(self, o): return self._bin("floordiv", o)  # noqa: E704
    def __mod__(self, o): return self._bin("mod", o)        # noqa: E704

    def __invert__(self) -> "Expr":
        return UnaryExpr("not", self)

    def __hash__(self):
        return id(self)

    def __bool__(self):
        raise TypeError("an expression has no truth value: combine expressions with & and |")

    def is_null(self) -> "Expr":
        return UnaryExpr("is_null", self)

    def is_not_null(self) -> "Expr":
        return UnaryExpr("is_valid", self)

    def is_in(self, values: Iterable[Any]) -> "Expr":
        return IsInExpr(self, list(values))

    def not_in(self, values: Iterable[Any]) -> "Expr":
        return ~self.is_in(values)

    def alias(self, name: str) -> "Expr":
        return AliasExpr(self, name)

    def eval(self, t: pa.Table):
        raise NotImplementedError


class ColumnExpr(Expr):
    def __init__(self, name: str):
        self.name = name

    def eval(self, t: pa.Table):
        if self.name not in t.column_names:
            raise ValueError(f"expression: no column {self.name!r} (columns: {t.column_names})")
        return t.column(self.name)

    def __repr__(self):
        return f"col({self.name!r})"


class LiteralExpr(Expr):
    def __init__(self, value: Any):
        self.value = value

    def eval(self, t: pa.Table):
        return pa.scalar(self.value)

    def __repr__(self):
        return f"lit({self.value!r})"


class BinaryExpr(Expr):
    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right

    def eval(self, t: pa.Table):
        a, b = self.left.eval(t), self.right.eval(t)
        if self.op == "floordiv":
            return _floordiv(a, b)
        if self.op == "mod":
            return _mod(a, b)
        return _BINARY[self.op](a, b)

    def __repr__(self):
        return f"({self.left!r} {self.op} {self.right!r})"


class UnaryExpr(Expr):
    def __init__(self, op: str, arg: Expr):
        self.op, self.arg = op, arg

    def eval(self, t: pa.Table):
        v = self.arg.eval(t)
        return {"not": pc.invert, "is_null": pc.is_null, "is_valid": pc.is_valid}[self.op](v)


class IsInExpr(Expr):
    def __init__(self, arg: Expr, values: list):
        self.arg, self.values = arg, values

    def eval(self, t: pa.Table):
        return pc.is_in(self.arg.eval(t), value_set=pa.array(self.values))


class AliasExpr(Expr):
    def __init__(self, arg: Expr, name: str):
        self.arg, self.name = arg, name

    def eval(self, t: pa.Table):
        return self.arg.eval(t)


def col(name: str) -> Expr:
    return ColumnExpr(name)


def lit(value: Any) -> Expr:
    return LiteralExpr(value)


def evaluate_column(expr: Expr, t: pa.Table):
    """The expression's value over the block as a column of its length."""
    v = expr.eval(t)
    if isinstance(v, pa.Scalar):
        return pa.array([v.as_py()] * t.num_rows, type=v.type)
    return v
