"""``parseable``: a value of the column parses as another type (``as``, with an optional ``format``)."""

from __future__ import annotations

import polars as pl

from keel.contracts.model import DTYPES
from keel.contracts.rules.base import RuleType
from keel.contracts.values import cast_expr, polars_text, polars_value


class Parseable(RuleType):
    name = "parseable"
    keys = frozenset({"column", "as", "format"})

    def read(self, r, m, path, columns):
        as_type = r.get(m, "as", path, (str,), required=True)
        if as_type not in DTYPES:
            raise r.fail(path + ("as",), f"'{as_type}' is not one of: {', '.join(DTYPES)}")
        return {"as": as_type, "format": r.get(m, "format", path, (str,))}

    def reason(self, p):
        return f"{p['column']} does not parse as {p['as']}"

    def batch(self, rule, prepared, ctx):
        p = rule.params
        c = pl.col(p["column"])
        return c.is_not_null() & cast_expr(c.cast(pl.String), pl.String(), p["as"], p.get("format")).is_null()

    def record(self, value, rule, prepared, ctx):
        if value is None:
            return False
        as_type, fmt = rule.params["as"], rule.params.get("format")
        parsed = polars_value(polars_text(value), lambda c, dt: cast_expr(c, pl.String(), as_type, fmt))
        return parsed is None
