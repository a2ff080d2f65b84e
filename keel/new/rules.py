"""The rules and choices ``keel new`` derives from one column or the time axis (keel/new/plan.py puts them together):
a numeric column's range, the duplicate and time rules, the task a label implies."""

from __future__ import annotations

import math

import polars as pl

from keel.new.choices import Options, PlanError, Rule
from keel.new.profile import ColumnProfile, TableProfile


def nice(x: float, up: bool) -> float:
    """``x`` rounded outward to 3 significant digits (a bound a person reads)."""
    if x == 0 or not math.isfinite(x):
        return 0.0 if x == 0 else x
    digits = 2 - math.floor(math.log10(abs(x)))
    scale = 10.0**-digits
    return round((math.ceil if up else math.floor)(x / scale) * scale, max(0, digits))


def numeric_range(c: ColumnProfile) -> tuple[float, float, str]:
    """The range a numeric column is held to, and how it was derived (see the module docstring)."""
    q01, q99 = c.q(0.01), c.q(0.99)
    if c.kind == "int" and c.distinct <= 12:
        return c.min, c.max, f"the {c.distinct} values seen, {c.min:g}…{c.max:g}"
    if c.positive is not None and c.positive[1] / c.positive[0] > 10:
        # a positive, skewed column (or one of zeros and positive values: rain, wind): its positive values' spread in
        # log space — a heavy shower is ten times the usual, not an error; a thousand times is
        p1, p99 = c.positive
        lq, hq = math.log10(p1), math.log10(p99)
        lo, hi = 10 ** (lq - (hq - lq)), 10 ** (hq + (hq - lq))
        how = f"p1 {p1:g} … p99 {p99:g} of its positive values widened by that spread in log space"
    else:
        span = (q99 - q01) or abs(q99) or 1.0
        lo, hi = q01 - span, q99 + span
        how = f"p1 {q01:g} … p99 {q99:g} widened by that spread"
    if c.min >= 0:
        lo, how = 0.0, how + ", from 0 (never negative)"
    lo, hi = nice(lo, up=False), nice(hi, up=True)
    if c.kind == "int":
        lo, hi = math.floor(lo), math.ceil(hi)
    return lo, hi, how


def n_rows(n: int) -> str:
    return f"{n:,} row" + ("" if n == 1 else "s")


def shown_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def null_words(c: ColumnProfile) -> str:
    return "empty" + (", " + ", ".join(repr(t) for t in c.null_tokens) if c.null_tokens else "")


def budget(share: float) -> float:
    """A rule's own failure budget: twice the share the profile saw, at least 1 %."""
    return round(min(1.0, max(0.01, 2 * share)), 3)


def label_domain(label: ColumnProfile) -> tuple[tuple[float | None, float | None, bool], str]:
    """A regression label's domain from its profile, and why (issue 61 item 7): never negative → from 0; whole
    numbers → integers; a share (never negative, never over 1) → [0, 1]. Answers and intervals are held to it."""
    lower = 0.0 if label.min is not None and label.min >= 0 else None
    upper = 1.0 if lower == 0.0 and label.max is not None and label.max <= 1 and label.kind == "float" else None
    integer = label.kind == "int"
    why = []
    if lower is not None:
        why.append(f"never negative (min {label.min:g})")
    if upper is not None:
        why.append(f"never over 1 (max {label.max:g}): a share")
    if integer:
        why.append("whole numbers only")
    return (lower, upper, integer), "; ".join(why) or "any real number"


def task_of(label: ColumnProfile, opts: Options) -> tuple[str, str | None]:
    values = [v for v, _ in label.categories]
    if opts.positive is not None:
        if opts.positive not in values:
            raise PlanError(
                f"--positive {opts.positive!r} is not a value of {label.ident} ({', '.join(values[:10])})"
            )
        return "binary", opts.positive
    if label.kind == "bool":
        return "binary", "true"
    binary01 = label.kind == "int" and label.distinct == 2 and (label.min, label.max) == (0, 1)
    task = opts.task or ("binary" if binary01 else "regression" if label.numeric else None)
    if task is None:
        raise PlanError(f"label {label.ident} is text ({', '.join(values[:6])}): name its positive value "
                        "(--positive VALUE) for a binary model")  # fmt: skip
    if task == "binary" and not binary01:
        raise PlanError(f"label {label.ident} is not 0/1 ({label.distinct} values): --positive VALUE says which is 1")
    if task == "regression" and not label.numeric:
        raise PlanError(f"label {label.ident} is {label.kind}: a regression label is a number")
    return task, None


def label_values(s, task: str, positive: str | None):
    if positive is not None:
        return (s.cast(pl.String) == positive).cast(pl.Float64).drop_nulls()
    return s.cast(pl.Float64).drop_nulls()


def categories_in(rows, ident: str) -> set[str]:
    return {str(v) for v in rows[ident].drop_nulls().unique().to_list()}


def median_rows(t, months: list[str]) -> float:
    counts = sorted(t.rows_per_month.get(m, 0) for m in months)
    return float(counts[len(counts) // 2]) if counts else 0.0


def first_day(month: str, t) -> str:
    first = f"{month}-01"
    return max(first, t.first.isoformat())


def last_day(month: str, t) -> str:
    import calendar

    y, m = (int(x) for x in month.split("-"))
    return min(f"{month}-{calendar.monthrange(y, m)[1]:02d}", t.last.isoformat())


def time_rules(time: ColumnProfile, profile: TableProfile, rules: list[Rule], defects: list[str]) -> int:
    t = profile.time
    rules.append(Rule("event_parts", {"type": "timestamp_parts", "column": time.ident,
                                      "parts": {"year": "event_year", "month": "event_month", "day": "event_day",
                                                "date": "event_date"}},
                      f"the reader derives the row's year, month, day and date from {time.ident} (the monthly "
                      "partition, the day it lands, the day it is scored as of); a delivery must agree"))  # fmt: skip
    if t.gaps:
        shown = "; ".join(f"{a} … {b}" for a, b in sorted(t.gaps, key=lambda g: (g[0] - g[1]).days)[:5])
        defects.append(
            f"{time.ident}: {len(t.gaps)} stretch{'' if len(t.gaps) == 1 else 'es'} with no row ({t.gap_days} days: "
            f"{shown}{'; …' if len(t.gaps) > 5 else ''}) in a {t.cadence} table — no row to judge, so no rule: named "
            "here, and the first model is validated on a month without one"
        )
    if time.nulls:
        defects.append(f"{time.ident}: {time.nulls} rows without a time ({null_words(time)}) — no month to place them "
                       "in: the reader keeps them out of every partition (counted by `keel new`)")  # fmt: skip
    return time.nulls


def duplicate_rule(profile: TableProfile, frame, entity: tuple[str, ...], defects: list[str]) -> tuple[Rule, int]:
    if entity:
        key = [*entity, profile.time.column]
        dups = frame.height - frame.unique(subset=key).height
        what = f"one row per {', '.join(entity)} and {profile.time.column}"
    else:
        key = [c.ident for c in profile.columns]
        dups = profile.duplicate_rows
        what = "no row repeated exactly"
    why = f"{what}; {dups} repeated rows in the table" + (": the repeats quarantined" if dups else "")
    if dups:
        defects.append(f"{dups} repeated rows ({what}) — the repeats quarantined (`one_row_once`)")
    return Rule("one_row_once", {"type": "unique", "columns": key, "severity": "warning", "action": "quarantine",
                                 "max_failure_fraction": budget(dups / profile.rows)}, why, dups), dups  # fmt: skip
