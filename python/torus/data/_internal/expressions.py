"""Filter expressions (``Dataset.filter(expr="x > 5 and name == 'a'")``): a small Python-syntax
subset compiled to pyarrow compute: comparisons, ``and``/``or``/``not``, ``in`` with a literal
list, ``is None``-style null tests via ``is_null(col)``, column names and literals. Anything
else is refused with a message naming it."""
from __future__ import annotations

import ast
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

_CMP = {ast.Eq: pc.equal, ast.NotEq: pc.not_equal, ast.Lt: pc.less, ast.LtE: pc.less_equal,
        ast.Gt: pc.greater, ast.GtE: pc.greater_equal}
_ARITH = {ast.Add: pc.add, ast.Sub: pc.subtract, ast.Mult: pc.multiply, ast.Div: pc.divide}


def compile_filter(expr: str) -> Callable[[pa.Table], pa.Array]:
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"filter: cannot parse expression {expr!r}: {e.msg}") from None

    def ev(node, t: pa.Table):
        if isinstance(node, ast.BoolOp):
            vals = [ev(v, t) for v in node.values]
            f = pc.and_kleene if isinstance(node.op, ast.And) else pc.or_kleene
            out = vals[0]
            for v in vals[1:]:
                out = f(out, v)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return pc.invert(ev(node.operand, t))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return pc.negate(ev(node.operand, t))
        if isinstance(node, ast.Compare):
            left, out = ev(node.left, t), None
            for op, right_node in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    vals = pa.array(ast.literal_eval(right_node))
                    r = pc.is_in(left, value_set=vals)
                    r = pc.invert(r) if isinstance(op, ast.NotIn) else r
                    right = left
                else:
                    right = ev(right_node, t)
                    r = _CMP[type(op)](left, right)
                out = r if out is None else pc.and_kleene(out, r)
                left = right
            return out
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](ev(node.left, t), ev(node.right, t))
        if isinstance(node, ast.Name):
            if node.id not in t.column_names:
                raise ValueError(f"filter: no column {node.id!r} (columns: {t.column_names})")
            return t.column(node.id)
        if isinstance(node, ast.Constant):
            return pa.scalar(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("is_null", "is_valid") and len(node.args) == 1:
            f = pc.is_null if node.func.id == "is_null" else pc.is_valid
            return f(ev(node.args[0], t))
        raise ValueError(f"filter: unsupported expression {ast.unparse(node)!r} in {expr!r}")

    def pred(t: pa.Table):
        r = ev(tree, t)
        return pc.fill_null(r, False)
    return pred
