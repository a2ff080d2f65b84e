"""``timestamp_parts``: a timestamp agrees with the columns that spell its parts, read in a time zone — the scheduled
hour in UTC is the same moment as the scheduled local date and hour.

- id: time_hour_is_the_scheduled_hour
  type: timestamp_parts
  column: time_hour              # a datetime column (UTC)
  timezone: America/New_York     # where the parts are read (an IANA name; default UTC)
  parts: {year: year, month: month, day: day, hour: hour}   # part → integer column

``date`` holds a date column to the timestamp's local date (``parts: {date: sched_date, hour: hour}``): a request
that sends both its date and its timestamp must send the same day.
UTC → local is one moment to one local time, also on the days clocks change, so the check is exact both ways. A
null timestamp or part is not this rule's violation (``not_null`` rules say that).
"""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import polars as pl

from keel.contracts.rules.base import RuleType
from keel.contracts.values import sql_column, sql_string

INTEGER = frozenset({"int8", "int16", "int32", "int64"})
PARTS = ("year", "month", "day", "hour", "minute", "date")
SQL_FIELDS = {"year": "YEAR", "month": "MONTH", "day": "DAY", "hour": "HOUR", "minute": "MINUTE"}


class TimestampParts(RuleType):
    name = "timestamp_parts"
    keys = frozenset({"column", "timezone", "parts"})
    column_types = frozenset({"datetime"})
    column_need = "a datetime column"

    def read(self, r, m, path, columns):
        tz = r.get(m, "timezone", path, (str,), default="UTC")
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise r.fail(
                path + ("timezone",), f"unknown time zone {tz!r} (an IANA name such as UTC or Europe/Paris)"
            ) from None
        parts = r.get(m, "parts", path, (dict,), required=True)
        if not parts:
            raise r.fail(path + ("parts",), f"name at least one of {', '.join(PARTS)}")
        by_name = {c.name: c for c in columns}
        for part, column in parts.items():
            if part not in PARTS:
                raise r.fail(path + ("parts", part), f"unknown part {part!r} (one of {', '.join(PARTS)})")
            if not isinstance(column, str) or column not in by_name:
                raise r.fail(path + ("parts", part), f"column {column!r} is not in the schema")
            want, types = ("a date", {"date"}) if part == "date" else ("an integer", INTEGER)
            if by_name[column].dtype not in types:
                raise r.fail(path + ("parts", part), f"'{column}' must be {want} column, is {by_name[column].dtype}")
        return {"timezone": tz, "parts": dict(parts)}

    def reason(self, p):
        spelled = ", ".join(f"{col} ({part})" for part, col in p["parts"].items())
        return f"{p['column']} in {p['timezone']} disagrees with {spelled}"

    def prepare(self, rule, spec):
        return ZoneInfo(rule.params["timezone"])

    def batch(self, rule, prepared, ctx):
        p = rule.params
        local = pl.col(p["column"]).dt.convert_time_zone(p["timezone"])
        bad = pl.lit(False)
        for part, column in p["parts"].items():
            if part == "date":
                differs = local.dt.date() != pl.col(column).cast(pl.Date)
            else:
                differs = getattr(local.dt, part)().cast(pl.Int64) != pl.col(column).cast(pl.Int64)
            bad = bad | differs.fill_null(False)
        return bad

    def record(self, value, rule, prepared, ctx):
        if value is None:
            return False
        local = value.astimezone(prepared)
        for part, column in rule.params["parts"].items():
            given = ctx.typed.get(column)
            if given is not None and (local.date() if part == "date" else getattr(local, part)) != given:
                return True
        return False

    def sql(self, rule, col, dtype, regex_rules):
        p = rule.params
        local = (
            f"TO_TIMESTAMP(CONVERT_TZ(DATE_FORMAT({col}, 'yyyy-MM-dd HH:mm:ss'), 'UTC', {sql_string(p['timezone'])}))"
        )
        checks = [f"CAST({local} AS DATE) <> {sql_column(c)}" if part == "date" else
                  f"EXTRACT({SQL_FIELDS[part]} FROM {local}) <> {sql_column(c)}" for part, c in p["parts"].items()]  # fmt: skip
        return " OR ".join(f"COALESCE({c}, FALSE)" for c in checks)
