"""``not_null``: the column has a value."""

from __future__ import annotations

import polars as pl

from keel.contracts.rules.base import RuleType


class NotNull(RuleType):
    name = "not_null"
    keys = frozenset({"column"})

    def reason(self, p):
        return f"{p['column']} is null"

    def batch(self, rule, prepared, ctx):
        return pl.col(rule.params["column"]).is_null()

    def record(self, value, rule, prepared, ctx):
        return value is None

    def sql(self, rule, col, dtype, regex_rules):
        return f"{col} IS NULL"
