"""``max_length``: a string column's value has at most ``max`` characters. The smallest rule type: copy it to add one.

- id: tailnum_short
  type: max_length
  column: tailnum
  max: 8
"""

from __future__ import annotations

import polars as pl

from keel.contracts.rules.base import RuleType


class MaxLength(RuleType):
    name = "max_length"
    keys = frozenset({"column", "max"})
    column_types = frozenset({"string"})
    column_need = "a string column"

    def read(self, r, m, path, columns):
        limit = r.get(m, "max", path, (int,), required=True)
        if limit < 0:
            raise r.fail(path + ("max",), "must be >= 0")
        return {"max": limit}

    def reason(self, p):
        return f"{p['column']} longer than {p['max']} characters"

    def batch(self, rule, prepared, ctx):
        return pl.col(rule.params["column"]).str.len_chars() > rule.params["max"]

    def record(self, value, rule, prepared, ctx):
        return value is not None and len(value) > rule.params["max"]

    def sql(self, rule, col, dtype, regex_rules):
        return f"CHAR_LENGTH({col}) > {int(rule.params['max'])}"
