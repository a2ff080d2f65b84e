"""``in_set``: the value is one of ``values``, or one of another dataset's column (``reference: planes.tailnum``)."""

from __future__ import annotations

import re

import polars as pl

from keel.contracts.model import DTYPES, kind
from keel.contracts.rules.base import NoStreamForm, RuleType
from keel.contracts.values import sql_literal
from keel.errors import InvalidNameError
from keel.names import validate_name

_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # a fixed pattern over contract text


class InSet(RuleType):
    name = "in_set"
    keys = frozenset({"column", "values", "reference"})

    def read(self, r, m, path, columns):
        if ("values" in m) == ("reference" in m):
            raise r.fail(path, "an in_set rule needs either 'values' (a list) or 'reference' (<dataset>.<column>)")
        if "reference" in m:
            ref = r.get(m, "reference", path, (str,))
            dataset, _, column = ref.partition(".")
            try:
                validate_name(dataset, what="reference dataset")
            except InvalidNameError as exc:
                raise r.fail(path + ("reference",), str(exc)) from None
            if not _COLUMN.fullmatch(column):
                raise r.fail(path + ("reference",), f"expected <dataset>.<column>, got {ref!r}")
            return {"reference": ref}
        values = r.get(m, "values", path, (list,))
        if not values:
            raise r.fail(path + ("values",), "an in_set rule needs at least one value")
        for j, v in enumerate(values):
            if not isinstance(v, (str, int, float, bool)):
                raise r.fail(path + ("values", j), f"values must be scalars, got {kind(v)}")
        return {"values": list(values)}

    def reason(self, p):
        if "reference" in p:
            return f"{p['column']} not in {p['reference']}"
        values = p["values"]
        shown = ", ".join(str(v) for v in values[:12]) + (f", … ({len(values)} values)" if len(values) > 12 else "")
        return f"{p['column']} not in {{{shown}}}"

    def prepare(self, rule, spec):
        p = rule.params
        if "values" not in p:
            return None  # a reference: its set comes with each call (RecordContext.reference_set)
        dtype = DTYPES[spec.column(p["column"]).dtype]
        return set(pl.Series(p["values"]).cast(dtype, strict=False).drop_nulls().to_list())

    def batch(self, rule, prepared, ctx):
        p = rule.params
        c = pl.col(p["column"])
        dtype = ctx.spec.column(p["column"]).polars_dtype
        raw_values = ctx.references[p["reference"]] if "reference" in p else pl.Series(p["values"])
        values = raw_values.cast(dtype, strict=False).drop_nulls().unique()
        return c.is_not_null() & ~c.is_in(values.implode())

    def record(self, value, rule, prepared, ctx):
        allowed = ctx.reference_set(rule) if "reference" in rule.params else prepared
        return value is not None and value not in allowed

    def sql(self, rule, col, dtype, regex_rules):
        if "reference" in rule.params:
            raise NoStreamForm
        return f"{col} NOT IN ({', '.join(sql_literal(x, dtype) for x in rule.params['values'])})"
