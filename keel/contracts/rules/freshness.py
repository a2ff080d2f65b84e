"""``freshness``: a date or datetime is no older than ``max_age`` before the partition's end (or ``now``). Needs the
partition window, so it has no streaming form."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from keel.contracts.model import parse_duration
from keel.contracts.rules.base import RuleType


class Freshness(RuleType):
    name = "freshness"
    keys = frozenset({"column", "max_age", "relative_to"})
    column_types = frozenset({"date", "datetime"})
    column_need = "a date or datetime column"

    def read(self, r, m, path, columns):
        try:
            text = r.get(m, "max_age", path, (str,), required=True)
            max_age = parse_duration(text)
        except ValueError as exc:
            raise r.fail(path + ("max_age",), str(exc)) from None
        relative_to = r.choice(m, "relative_to", path, ("partition_end", "now"), "partition_end")
        return {"max_age_text": text, "max_age": max_age, "relative_to": relative_to}

    def reason(self, p):
        return f"{p['column']} older than {p['max_age_text']} before the {p['relative_to'].replace('_', ' ')}"

    def batch(self, rule, prepared, ctx):
        p = rule.params
        c = pl.col(p["column"])
        ts = c.cast(pl.Datetime("us", "UTC")) if ctx.spec.column(p["column"]).dtype == "date" else c
        return (ctx.ref_time - ts) > pl.lit(p["max_age"])

    def record(self, value, rule, prepared, ctx):
        if value is None:
            return False
        p = rule.params
        ts = datetime(value.year, value.month, value.day, tzinfo=UTC) if not isinstance(value, datetime) else value
        end = ctx.partition_end
        if p["relative_to"] == "now":
            ref = datetime.now(UTC)
        elif end is not None:
            ref = end if end.tzinfo else end.replace(tzinfo=UTC)
        else:
            ref = ts  # a one-row batch measures against its own newest event: itself
        return (ref - ts) > p["max_age"]
