"""Defects in the values of a time series that no single row shows (issue 61 item 11) — each found in the profiled
frame, named with its evidence in PROFILE.md and the contract, and given a rule:

- **a stuck sensor**: a numeric column that varies within a day on ``VARIES`` of the days, holding one value over a
  whole day of at least ``MIN_ROWS`` rows (a day of humidity 0) — rule ``<col>_stuck`` (type ``stuck``, per day:
  flagged; a day stuck on most of its rows is a broken delivery, held back by the delivery gate);
- **impossible zeros**: a column never negative whose positive values never come near zero (their 1st percentile is
  ``DETACHED`` or more of their median) that still reads exactly 0 on some rows — a zero that is a missing reading,
  not a measurement — rule ``<col>_not_zero`` (a ``condition``: flagged and counted);
- **missing periods** are the time axis's (``keel.new.profile``: days without a row, and for an hourly table the
  missing hours): no row to judge, so named, never a rule.
"""

from __future__ import annotations

import polars as pl

from keel.new.choices import Rule
from keel.new.leakage import label_leaks
from keel.new.profile import ColumnProfile, TableProfile
from keel.new.rules import budget, n_rows, shown_number

MIN_ROWS = 4  # a day this long holding one value is stuck (a sensor reads every hour)
VARIES = 0.9  # of the days of at least MIN_ROWS rows, on which the column usually varies
DETACHED = 0.3  # positive values' p1 / p50 at or above which a zero is no value the column takes


def stuck_days(frame: pl.DataFrame, c: ColumnProfile, day: str) -> list[tuple[str, float, int]]:
    """(day, the value held, rows) of each day ``c`` is stuck on; [] when it does not usually vary within a day."""
    per_day = (
        frame.group_by(day)
        .agg(pl.col(c.ident).count().alias("n"), pl.col(c.ident).min().alias("lo"), pl.col(c.ident).max().alias("hi"))
        .filter(pl.col("n") >= MIN_ROWS)
        .sort(day)
    )
    if per_day.height < 5 or float((per_day["hi"] > per_day["lo"]).mean()) < VARIES:
        return []
    stuck = per_day.filter(pl.col("hi") == pl.col("lo"))
    return [(str(d), float(v), int(n)) for d, v, n in stuck.select(day, "lo", "n").iter_rows()]


def zero_readings(frame: pl.DataFrame, c: ColumnProfile) -> tuple[int, float, float] | None:
    """(rows reading 0, the positive values' p1 and median) when ``c``'s zeros are impossible, else None."""
    if c.min is None or c.min != 0 or c.max is None or c.max <= 0:
        return None
    values = frame[c.ident].drop_nulls().cast(pl.Float64)
    zeros = int((values == 0).sum())
    positive = values.filter(values > 0)
    if not zeros or zeros >= 0.5 * values.len() or positive.len() < 20:
        return None
    p1, p50 = float(positive.quantile(0.01, "linear")), float(positive.quantile(0.5, "linear"))
    return (zeros, p1, p50) if p50 > 0 and p1 >= DETACHED * p50 else None


def value_defects(
    frame: pl.DataFrame, columns: list[ColumnProfile], day: str, rows: int
) -> tuple[list[Rule], list[str]]:
    """The rules and the defects' lines for ``columns`` (numeric, not the time) of ``frame`` (``day``: the row's day
    column; ``rows``: the table's)."""
    rules, defects = [], []
    for c in columns:
        if not c.numeric:
            continue
        days = stuck_days(frame, c, day)
        if days:
            held = sum(n for _, _, n in days)
            shown = "; ".join(f"{d} at {shown_number(v)}" for d, v, _ in days[:5]) + ("; …" if len(days) > 5 else "")
            why = (
                f"{c.ident} varies within a day on at least {VARIES:.0%} of the days but holds one value all day on "
                f"{len(days)} ({shown}): a stuck sensor — flagged; a day stuck on most of its rows is held back"
            )
            rules.append(
                Rule(
                    f"{c.ident}_stuck",
                    {
                        "type": "stuck",
                        "column": c.ident,
                        "per": day,
                        "min_rows": MIN_ROWS,
                        "severity": "warning",
                        "action": "flag",
                        "max_failure_fraction": budget(held / rows),
                    },
                    why,
                    held,
                )
            )
            defects.append(
                f"{c.ident}: stuck on {len(days)} day{'s' if len(days) > 1 else ''} ({shown}; "
                f"{n_rows(held)}) — flagged (`{c.ident}_stuck`)"
            )
        zeros = zero_readings(frame, c)
        if zeros is not None:
            n, p1, p50 = zeros
            why = (
                f"{c.ident} reads exactly 0 on {n_rows(n)} ({n / rows:.1%}), but its other values never come near 0 "
                f"(their p1 {p1:g}, median {p50:g}): a zero is a missing reading — flagged, counted"
            )
            rules.append(
                Rule(
                    f"{c.ident}_not_zero",
                    {
                        "type": "condition",
                        "expr": f"{c.ident} is null or {c.ident} > 0",
                        "severity": "warning",
                        "action": "flag",
                        "max_failure_fraction": budget(n / rows),
                    },
                    why,
                    n,
                )
            )
            defects.append(
                f"{c.ident}: {n_rows(n)} read exactly 0 while its values never come near it (p1 {p1:g}) — "
                f"impossible zeros, flagged (`{c.ident}_not_zero`)"
            )
    return rules, defects


def table_defects(
    frame: pl.DataFrame,
    profile: TableProfile,
    time: ColumnProfile,
    label: ColumnProfile,
    positive: str | None,
    columns: list[ColumnProfile],
) -> tuple[dict[str, str], list[Rule], list[str]]:
    """What ``keel new`` finds in ``columns`` (neither the label, the time nor the entity): the columns that give the
    label away (column → why: never features), the rules for a stuck sensor and impossible zeros in the others (per
    ``event_date``, the row's day the reader adds), and the defects' lines."""
    numeric_label = (pl.col(label.ident).cast(pl.String) == positive) if positive is not None else pl.col(label.ident)
    leaks = label_leaks(frame, label.ident, time.ident, columns, numeric_label)
    defects = [f"{col}: gives the label away — {why}: refused as a feature" for col, why in leaks.items()]
    day = pl.col(time.ident).dt.date() if time.kind == "datetime" else pl.col(time.ident)
    found, lines = value_defects(
        frame.with_columns(day.alias("_day")), [c for c in columns if c.ident not in leaks], "_day", profile.rows
    )
    rules = [
        Rule(r.id, r.fields | ({"per": "event_date"} if "per" in r.fields else {}), r.why, r.failing) for r in found
    ]
    return leaks, rules, defects + lines
