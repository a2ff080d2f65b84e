"""``condition``: a row-level expression in keel's condition language (keel.contracts.dsl: comparisons, ``and``/``or``,
``if … then …``), parsed — never evaluated as Python — and type-checked against the schema when the contract is read."""

from __future__ import annotations

import polars as pl

from keel.contracts.dsl import DslError, parse_condition
from keel.contracts.rules.base import RuleType
from keel.contracts.values import dsl_sql


class Condition(RuleType):
    name = "condition"
    keys = frozenset({"expr"})

    def read(self, r, m, path, columns):
        expr_text = r.get(m, "expr", path, (str,), required=True)
        try:
            parsed = parse_condition(expr_text)
        except DslError as exc:
            raise r.fail(path + ("expr",), f"cannot parse condition {expr_text!r}: {exc}") from None
        unknown = sorted(parsed.columns - {c.name for c in columns})
        if unknown:
            raise r.fail(path + ("expr",), f"condition reads column '{unknown[0]}', which is not in the schema")
        # Type-check against the schema now (e.g. a string compared with a number), not at run time.
        empty = pl.DataFrame(schema={c.name: c.polars_dtype for c in columns})
        try:
            empty.select(parsed.violation)
        except Exception as exc:  # polars raises several error types for ill-typed expressions
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise r.fail(path + ("expr",), f"condition {expr_text!r} does not type-check: {first}") from None
        return {"expr": expr_text, "_condition_columns": sorted(parsed.columns)}

    def reason(self, p):
        return f"condition violated: {p['expr']}"

    def prepare(self, rule, spec):
        return parse_condition(rule.params["expr"])

    def batch(self, rule, prepared, ctx):
        return prepared.violation

    def record(self, value, rule, prepared, ctx):
        return prepared.violated_by(ctx.typed)

    def sql(self, rule, col, dtype, regex_rules):
        cond = parse_condition(rule.params["expr"])
        check = f"({dsl_sql(cond.check)}) IS FALSE"
        return f"({dsl_sql(cond.guard)}) IS TRUE AND {check}" if cond.guard is not None else check
