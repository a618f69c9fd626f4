"""Ray Data's filter expressions (``ds.filter(expr=col("layer") == 1)``, ``expr="layer == 1"``) as
Polars expressions, so that a filter Ray pushes into kvfast's source is applied as ``filter=`` is:
to the plan where it chooses records, to each record's index, then to the rows.

Only what has one meaning in both is translated: columns, literals, comparisons, ``&``, ``|``,
``~``, ``is_in`` / ``not_in``, ``is_null`` / ``is_not_null``. Anything else (arithmetic, whose
integer division differs, functions, UDFs) gives None, and Ray keeps its own filter.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import polars as pl

_BINARY: dict[str, Callable[[pl.Expr, pl.Expr], pl.Expr]] = {
    "gt": operator.gt,
    "lt": operator.lt,
    "ge": operator.ge,
    "le": operator.le,
    "eq": operator.eq,
    "ne": operator.ne,
    "and": operator.and_,
    "or": operator.or_,
}
_UNARY: dict[str, Callable[[pl.Expr], pl.Expr]] = {
    "not": operator.invert,
    "is_null": pl.Expr.is_null,
    "is_not_null": pl.Expr.is_not_null,
}


def to_polars(expr: Any) -> pl.Expr | None:
    """The Polars expression of a Ray Data expression, or None where they could differ."""
    from ray.data.expressions import BinaryExpr, ColumnExpr, LiteralExpr, UnaryExpr

    if isinstance(expr, ColumnExpr):
        return pl.col(expr.name)
    if isinstance(expr, LiteralExpr):
        value = expr.value
        return None if isinstance(value, (list, tuple, set, dict)) else pl.lit(value)
    if isinstance(expr, UnaryExpr):
        inner = to_polars(expr.operand)
        unary = _UNARY.get(str(expr.op.value))
        return None if inner is None or unary is None else unary(inner)
    if isinstance(expr, BinaryExpr):
        op = str(expr.op.value)
        left = to_polars(expr.left)
        if op in ("in", "not_in"):
            values = getattr(expr.right, "value", None)
            if (
                left is None
                or not isinstance(expr.right, LiteralExpr)
                or not isinstance(values, (list, tuple))
            ):
                return None
            found = left.is_in(list(values))
            return found if op == "in" else ~found
        right = to_polars(expr.right)
        fn = _BINARY.get(op)
        return None if left is None or right is None or fn is None else fn(left, right)
    return None
