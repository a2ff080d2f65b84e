"""``unique``: no two rows of the partition share the key ``columns`` (rows with a null in the key are exempt). A single
record cannot repeat a key, and a stream has no partition: no streaming form."""

from __future__ import annotations

import polars as pl

from keel.contracts.rules.base import RuleType


class Unique(RuleType):
    name = "unique"
    keys = frozenset({"columns"})

    def read(self, r, m, path, columns):
        cols = r.get(m, "columns", path, (list, str), required=True)
        cols = [cols] if isinstance(cols, str) else cols
        if not cols or not all(isinstance(c, str) for c in cols):
            raise r.fail(path + ("columns",), "expected a column name or a list of column names")
        return {"columns": list(cols)}

    def reason(self, p):
        return f"duplicate key ({', '.join(p['columns'])})"

    def batch(self, rule, prepared, ctx):
        cols = rule.params["columns"]
        key = pl.col(cols[0]) if len(cols) == 1 else pl.struct(cols)
        return pl.all_horizontal([pl.col(x).is_not_null() for x in cols]) & ~key.is_first_distinct()

    def record(self, value, rule, prepared, ctx):
        return False  # a single record cannot repeat a key
