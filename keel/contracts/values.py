"""Typed values, shared by the batch path, the record path and the rule types: casting text and numbers to the
contract's types the way polars does (``cast_expr``), range bounds as values and literals, and the record path's
one-value helpers that ask polars (or flpc, the same Rust regex engine) so that both paths agree by construction."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import flpc
import polars as pl

from keel.contracts.dsl import Node
from keel.contracts.model import DTYPES
from keel.errors import ContractError


def cast_expr(src: pl.Expr, src_dtype: pl.DataType, target: str, fmt: str | None) -> pl.Expr:
    """Parse/cast ``src`` to the contract type; values that do not fit become null (never an exception).

    Booleans are not numbers (``true`` in an integer or float column is a type violation, not 1), and a timestamp
    outside the years 1…9999 is one too (Python, hence every record and every consumer, cannot represent it)."""
    tdtype = DTYPES[target]
    if src_dtype == tdtype:
        return src
    if target == "datetime":
        parsed = _cast_expr(src, src_dtype, target, fmt)
        return pl.when(parsed.dt.year().is_between(1, 9999)).then(parsed).otherwise(None)
    return _cast_expr(src, src_dtype, target, fmt)


def _cast_expr(src: pl.Expr, src_dtype: pl.DataType, target: str, fmt: str | None) -> pl.Expr:
    tdtype = DTYPES[target]
    if src_dtype == pl.Boolean and (target.startswith("int") or target.startswith("float")):
        return pl.lit(None, dtype=tdtype)
    is_text = src_dtype in (pl.String, pl.Categorical) or isinstance(src_dtype, pl.Enum)
    if is_text:
        text = src.cast(pl.String).str.strip_chars()
        if target == "bool":
            lowered = text.str.to_lowercase()
            return (
                pl.when(lowered.is_in(["true", "t", "yes", "1"]))
                .then(True)
                .when(lowered.is_in(["false", "f", "no", "0"]))
                .then(False)
                .otherwise(None)
            )
        if target == "datetime":
            if fmt and "%z" in fmt:
                return text.str.strptime(pl.Datetime("us"), fmt, strict=False).dt.convert_time_zone("UTC")
            if fmt:
                return text.str.strptime(pl.Datetime("us"), fmt, strict=False).dt.replace_time_zone("UTC")
            return text.str.strptime(pl.Datetime("us"), "%Y-%m-%dT%H:%M:%S", strict=False).dt.replace_time_zone("UTC")
        if target == "date":
            return text.str.strptime(pl.Date, fmt or "%Y-%m-%d", strict=False)
        if target == "string":
            return src.cast(pl.String)
        return text.cast(tdtype, strict=False)
    if target == "string":
        return src.cast(pl.String, strict=False)
    if target in ("date", "datetime") and not src_dtype.is_temporal():
        # A bare number is not a timestamp: epoch units are ambiguous and out-of-range values cannot be represented.
        return pl.lit(None, dtype=tdtype)
    if target.startswith("int") and src_dtype.is_float():
        # 1.5 must not silently become 1: only whole, finite numbers are valid integers.
        return pl.when(src.is_finite() & (src == src.round(0))).then(src).otherwise(None).cast(tdtype, strict=False)
    if target == "datetime" and isinstance(src_dtype, pl.Datetime):
        aware = src.dt.replace_time_zone("UTC") if src_dtype.time_zone is None else src.dt.convert_time_zone("UTC")
        return aware.cast(pl.Datetime("us", "UTC"))
    if target == "bool" and src_dtype.is_numeric():
        return pl.when(src == 1).then(True).when(src == 0).then(False).otherwise(None)
    return src.cast(tdtype, strict=False)


def to_text(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    if dtype == pl.String:
        return expr
    if dtype.is_nested():
        return pl.struct(expr.alias("v")).struct.json_encode()
    return expr.cast(pl.String, strict=False)


def literal_value(value: Any, dtype: str) -> Any:
    """A range bound as the Python value it means for a column of ``dtype``."""
    from datetime import date

    if dtype == "datetime" and isinstance(value, str):
        dt = datetime.fromisoformat(value)
        return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    if dtype == "date" and isinstance(value, str):
        return date.fromisoformat(value)
    return value


def literal_for(value: Any, dtype: str) -> pl.Expr:
    lit = literal_value(value, dtype)
    if dtype == "datetime":
        return pl.lit(lit).cast(pl.Datetime("us", "UTC"))
    return pl.lit(lit)


@lru_cache(maxsize=1024)
def compiled_regex(pattern: str) -> Any:
    return flpc.compile(pattern)


def regex_matches(pattern: str, value: str) -> bool:
    """Search semantics of polars' ``str.contains``, on the same Rust ``regex`` crate (via flpc), compiled once.

    polars compiles the pattern on every call (~300 µs); flpc keeps the compiled automaton (<1 µs a match).
    """
    return flpc.search(compiled_regex(pattern), value) is not None


def polars_value(value: Any, expr_for: Any) -> Any:
    """Apply a polars expression builder to a one-value frame, exactly as the batch path would on that value."""
    frame = pl.DataFrame({"v": [value]})
    return frame.select(expr_for(pl.col("v"), frame.schema["v"]).alias("v")).item()


def polars_text(value: Any) -> str | None:
    """``value`` cast to text the way polars does it (floats, booleans and timestamps differ from Python's str)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return pl.Series([value]).cast(pl.String, strict=False).item()


SQL_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a fixed pattern over contract column names


# -- the same values as Flink SQL literals (keel.streaming.contract_sql) ------------------------------------------


def sql_string(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def sql_literal(value: Any, dtype: str | None = None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ContractError(f"non-finite literal {value!r} has no SQL form")
        if dtype in ("float32", "float64") or isinstance(value, float):
            return f"CAST({float(value)!r} AS DOUBLE)"  # a bare 10.35 is a DECIMAL in Flink SQL
        return str(value)
    return sql_string(value)


def sql_column(name: str) -> str:
    if not SQL_IDENT.match(name):
        raise ContractError(f"column name {name!r} cannot be used in the streaming path")
    return f"`{name}`"


def dsl_sql(node: Node) -> str:
    """The contract condition language in SQL (same three-valued meaning as its polars backend)."""
    op, a = node.op, node.args
    if op == "col":
        return sql_column(a[0])
    if op == "lit":
        return sql_literal(a[0])
    if op == "neg":
        return f"(-{dsl_sql(a[0])})"
    if op == "arith":
        left, right = dsl_sql(a[1]), dsl_sql(a[2])
        if a[0] == "/":
            return f"(CAST({left} AS DOUBLE) / NULLIF(CAST({right} AS DOUBLE), 0))"
        return f"({left} {a[0]} {right})"
    if op == "cmp":
        sym = {"==": "=", "!=": "<>"}.get(a[0], a[0])
        return f"({dsl_sql(a[1])} {sym} {dsl_sql(a[2])})"
    if op in ("and", "or"):
        return f"({dsl_sql(a[0])} {op.upper()} {dsl_sql(a[1])})"
    if op == "not":
        return f"(NOT {dsl_sql(a[0])})"
    if op == "isnull":
        return f"({dsl_sql(a[0])} IS NULL)"
    if op == "notnull":
        return f"({dsl_sql(a[0])} IS NOT NULL)"
    if op in ("in", "notin"):
        values = ", ".join(sql_literal(v) for v in a[1])
        return f"({dsl_sql(a[0])} {'NOT IN' if op == 'notin' else 'IN'} ({values}))"
    raise AssertionError(op)
