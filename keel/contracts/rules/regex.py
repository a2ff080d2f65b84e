"""``regex``: a string value matches ``pattern`` (search semantics), on linear-time engines only: polars for batches,
flpc (the same Rust ``regex`` crate) for single records, a Java UDF wrapping it in Flink. Python's ``re`` never sees
a user pattern."""

from __future__ import annotations

import polars as pl

from keel.contracts.model import regex_error
from keel.contracts.rules.base import RuleType
from keel.contracts.values import regex_matches


class Regex(RuleType):
    name = "regex"
    keys = frozenset({"column", "pattern"})
    column_types = frozenset({"string"})
    column_need = "a string column"

    def read(self, r, m, path, columns):
        pattern = r.get(m, "pattern", path, (str,), required=True)
        error = regex_error(pattern)
        if error:
            raise r.fail(path + ("pattern",), f"invalid regex {pattern!r}: {error}")
        return {"pattern": pattern}

    def reason(self, p):
        return f"{p['column']} does not match {p['pattern']}"

    def batch(self, rule, prepared, ctx):
        c = pl.col(rule.params["column"])
        return c.is_not_null() & ~c.str.contains(rule.params["pattern"])

    def record(self, value, rule, prepared, ctx):
        return value is not None and not regex_matches(rule.params["pattern"], value)

    def sql(self, rule, col, dtype, regex_rules):
        regex_rules.append((rule.id, rule.params["column"], rule.params["pattern"]))
        return f"{col} IS NOT NULL AND NOT keel_regex_{len(regex_rules) - 1}({col})"
