"""``decimal``: a numeric value fits ``decimal(precision, scale)``: at most ``scale`` digits after the point and
``precision - scale`` before it."""

from __future__ import annotations

import math

import polars as pl

from keel.contracts.model import NUMERIC
from keel.contracts.rules.base import RuleType


class Decimal(RuleType):
    name = "decimal"
    keys = frozenset({"column", "precision", "scale"})
    column_types = frozenset(NUMERIC)
    column_need = "a numeric column"

    def read(self, r, m, path, columns):
        precision = r.get(m, "precision", path, (int,), required=True)
        scale = r.get(m, "scale", path, (int,), required=True)
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise r.fail(path + ("precision",), "need 1 <= precision <= 38 and 0 <= scale <= precision")
        return {"precision": precision, "scale": scale}

    def reason(self, p):
        return f"{p['column']} does not fit decimal({p['precision']},{p['scale']})"

    def batch(self, rule, prepared, ctx):
        p = rule.params
        c = pl.col(p["column"])
        scaled = c.cast(pl.Float64) * (10 ** p["scale"])
        off_scale = (scaled - scaled.round(0)).abs() > 1e-6 * pl.max_horizontal(pl.lit(1.0), scaled.abs())
        too_wide = c.cast(pl.Float64).abs() >= 10 ** (p["precision"] - p["scale"])
        return off_scale | too_wide

    def record(self, value, rule, prepared, ctx):
        if value is None:
            return False
        p = rule.params
        f = float(value)
        if not math.isfinite(f):
            return True
        scaled = f * (10 ** p["scale"])
        return (
            not math.isfinite(scaled)  # overflowed: polars gets NaN here, which fails
            or abs(scaled - round(scaled)) > 1e-6 * max(1.0, abs(scaled))
            or abs(f) >= 10 ** (p["precision"] - p["scale"])
        )

    def sql(self, rule, col, dtype, regex_rules):
        p = rule.params
        scaled = f"(CAST({col} AS DOUBLE) * {float(10 ** p['scale'])})"
        return (
            f"ABS({scaled} - ROUND({scaled}, 0)) > 1e-6 * GREATEST(1.0, ABS({scaled})) "
            f"OR ABS(CAST({col} AS DOUBLE)) >= {float(10 ** (p['precision'] - p['scale']))}"
        )
