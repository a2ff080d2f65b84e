"""``stuck``: a column holds one value over a whole ``per`` group (a day) of at least ``min_rows`` rows with a value —
a sensor stuck (a day of humidity 0). Every row of such a group fails. A single record cannot show a run, and a
stream has no whole day: batch only, no streaming form."""

from __future__ import annotations

import polars as pl

from keel.contracts.rules.base import NoStreamForm, RuleType


class Stuck(RuleType):
    name = "stuck"
    keys = frozenset({"column", "per", "min_rows"})

    def read(self, r, m, path, columns):
        per = r.get(m, "per", path, (str,), required=True)
        if per not in {c.name for c in columns}:
            raise r.fail(path + ("per",), f"stuck: per names column '{per}', which is not in the schema")
        min_rows = r.get(m, "min_rows", path, (int,), default=4)
        if isinstance(min_rows, bool) or min_rows < 2:
            raise r.fail(path + ("min_rows",), f"stuck: min_rows must be an integer of at least 2, got {min_rows!r}")
        return {"per": per, "min_rows": min_rows}

    def reason(self, p):
        return f"{p['column']} holds one value over a whole {p['per']} of at least {p['min_rows']} rows (stuck)"

    def batch(self, rule, prepared, ctx):
        c, per = pl.col(rule.params["column"]), rule.params["per"]
        return (
            c.is_not_null()
            & (c.count().over(per) >= rule.params["min_rows"])
            & (c.min().over(per) == c.max().over(per))
        )

    def record(self, value, rule, prepared, ctx):
        return False  # one record is no run

    def sql(self, rule, col, dtype, regex_rules):
        raise NoStreamForm
