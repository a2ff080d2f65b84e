"""``range``: a numeric or temporal value lies within ``min`` and/or ``max`` (each inclusive unless said)."""

from __future__ import annotations

import polars as pl

from keel.contracts.dsl import compare_values
from keel.contracts.model import NUMERIC, is_iso
from keel.contracts.rules.base import RuleType
from keel.contracts.values import literal_for, literal_value, sql_literal


class Range(RuleType):
    name = "range"
    keys = frozenset({"column", "min", "max", "min_inclusive", "max_inclusive"})
    column_types = frozenset(NUMERIC | {"date", "datetime"})
    column_need = "a numeric or temporal column"

    def read(self, r, m, path, columns):
        lo = r.get(m, "min", path, (int, float, str))
        hi = r.get(m, "max", path, (int, float, str))
        if lo is None and hi is None:
            raise r.fail(path, "a range rule needs 'min', 'max' or both")
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
            raise r.fail(path + ("min",), f"min ({lo}) is greater than max ({hi})")
        return {
            "min": lo,
            "max": hi,
            "min_inclusive": r.get(m, "min_inclusive", path, (bool,), default=True),
            "max_inclusive": r.get(m, "max_inclusive", path, (bool,), default=True),
        }

    def check_column(self, r, path, params, column):
        super().check_column(r, path, params, column)
        for bound in ("min", "max"):
            value = params[bound]
            if value is None:
                continue
            if column.dtype in NUMERIC and not isinstance(value, (int, float)):
                raise r.fail(
                    path + (bound,),
                    f"{bound} must be a number for {column.dtype} column '{column.name}', got {value!r}",
                )
            if column.dtype in ("date", "datetime") and not is_iso(value, column.dtype):
                raise r.fail(
                    path + (bound,),
                    f"{bound} must be an ISO {column.dtype} string for column '{column.name}', got {value!r}",
                )

    def reason(self, p):
        lo = ("[" if p["min_inclusive"] else "(") + ("-inf" if p["min"] is None else str(p["min"]))
        hi = ("inf" if p["max"] is None else str(p["max"])) + ("]" if p["max_inclusive"] else ")")
        return f"{p['column']} outside {lo}, {hi}"

    def prepare(self, rule, spec):
        p = rule.params
        dtype = spec.column(p["column"]).dtype
        return (
            None if p["min"] is None else literal_value(p["min"], dtype),
            None if p["max"] is None else literal_value(p["max"], dtype),
        )

    def batch(self, rule, prepared, ctx):
        p = rule.params
        c = pl.col(p["column"])
        dtype = ctx.spec.column(p["column"]).dtype
        bad = pl.lit(False)
        if p["min"] is not None:
            lo = literal_for(p["min"], dtype)
            bad = bad | ((c < lo) if p["min_inclusive"] else (c <= lo))
        if p["max"] is not None:
            hi = literal_for(p["max"], dtype)
            bad = bad | ((c > hi) if p["max_inclusive"] else (c >= hi))
        return bad

    def record(self, value, rule, prepared, ctx):
        p = rule.params
        lo, hi = prepared
        bad = False
        if value is not None:
            if lo is not None:
                bad = compare_values("<" if p["min_inclusive"] else "<=", value, lo)
            if hi is not None and not bad:
                bad = compare_values(">" if p["max_inclusive"] else ">=", value, hi)
        return bad

    def sql(self, rule, col, dtype, regex_rules):
        p = rule.params
        parts = []
        if p["min"] is not None:
            parts.append(f"{col} {'<' if p['min_inclusive'] else '<='} {sql_literal(p['min'], dtype)}")
        if p["max"] is not None:
            parts.append(f"{col} {'>' if p['max_inclusive'] else '>='} {sql_literal(p['max'], dtype)}")
        return " OR ".join(parts) or "FALSE"
