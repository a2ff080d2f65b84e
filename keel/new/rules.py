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


FEW_VALUES = 31  # an integer column with at most this many values is an enumeration (hours, weekdays, days, months)
# A column never negative whose 0.1st percentile is more than this share of its median never comes near 0: zero is
# no floor of its nature (a temperature in °F that did not freeze that year, a pressure in hPa) — its range is its
# spread's, and a label's answers are not held at 0
DETACHED_FROM_ZERO = 0.2


def zero_is_near(c: ColumnProfile) -> bool:
    """Does a column never negative come down to 0 (a count, an amount, rain), rather than sit far above it?"""
    if not c.quantiles:
        return True
    return c.q(0.001) <= DETACHED_FROM_ZERO * max(c.q(0.5), 0.0)


def numeric_range(c: ColumnProfile) -> tuple[float, float, str]:
    """The range a numeric column is held to, and how it was derived — from the column's nature, never a skew test
    (issue 61 item 8: an hour column got [0, 529] and a count label [0, 307000], and the gateway scored hr 100):

    - an integer with few values (at most ``FEW_VALUES``: hours, weekdays, months): the values it holds — its
      0.1st…99.9th percentile, so one absurd row does not widen it;
    - a share (never negative, never over 1, and reaching 0.9): [0, 1] — a small measure that never reached 0.9
      (rain in inches an hour) is no share;
    - a percentage (never negative, 100 at most and reaching it): [0, 100];
    - an angle in degrees (never negative, 360 at most and reaching 350): [0, 360];
    - a column never negative that comes down to 0 (``zero_is_near``): from 0 to twice its 99.9th percentile (a busy
      day twice the busiest usual one is plausible; ten times is an entry or unit error);
    - any other (signed, or far above 0: °F, hPa): its 1st…99th percentile widened by that spread on each side.
    """
    q01, q99 = c.q(0.01), c.q(0.99)
    lo_bulk, hi_bulk = c.q(0.001), c.q(0.999)
    if c.kind == "int" and c.distinct <= FEW_VALUES:
        lo, hi = math.floor(lo_bulk), math.ceil(hi_bulk)
        return (
            lo,
            hi,
            f"an integer of {c.distinct} values: the ones it holds, {lo:g}…{hi:g} (0.1st…99.9th percentile)",
        )
    if c.min >= 0 and c.max <= 1 and c.kind == "float" and c.max >= 0.9:
        return 0.0, 1.0, f"a share: never negative, never over 1 (seen {c.min:g}…{c.max:g})"
    if c.min >= 0 and c.max == 100 and hi_bulk >= 90:
        return 0.0, 100.0, f"a percentage: never negative, never over 100 (seen {c.min:g}…{c.max:g})"
    if c.min >= 0 and 350 <= c.max <= 360 and hi_bulk >= 300:
        return 0.0, 360.0, f"an angle in degrees: 0…360 (seen {c.min:g}…{c.max:g})"
    if c.min >= 0 and zero_is_near(c):
        lo, hi = 0.0, nice(2 * hi_bulk, up=True) or 1.0
        how = f"never negative: from 0 to twice its 99.9th percentile ({hi_bulk:g})"
    else:
        span = (q99 - q01) or abs(q99) or 1.0
        lo, hi = nice(q01 - span, up=False), nice(q99 + span, up=True)
        far = " (never near 0: no floor at 0)" if c.min >= 0 else ""
        how = f"p1 {q01:g} … p99 {q99:g} widened by that spread{far}"
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
    """A regression label's domain from its profile, and why (issue 61 item 7): never negative and coming down to 0
    → from 0 (a temperature that never froze is not held at 0); whole numbers → integers; a share (never negative,
    never over 1) → [0, 1]. Answers and intervals are held to it."""
    lower = 0.0 if label.min is not None and label.min >= 0 and zero_is_near(label) else None
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
    if t.missing_hours:
        shown = "; ".join(f"{a} … {b} ({n} h)" for a, b, n in t.missing_stretches[:5])
        more = "; …" if len(t.missing_stretches) > 5 else ""
        defects.append(
            f"{time.ident}: {t.missing_hours} hours without a row in an hourly table, besides the days named above "
            f"({len(t.missing_stretches)} stretches, longest first: {shown}{more}) — missing periods: no row to "
            "judge, so no rule: named here"
        )
    if time.nulls:
        defects.append(f"{time.ident}: {time.nulls} rows without a time ({null_words(time)}) — no month to place them "
                       "in: the reader keeps them out of every partition (counted by `keel new`)")  # fmt: skip
    return time.nulls


def duplicate_rule(
    profile: TableProfile, frame, entity: tuple[str, ...], defects: list[str], keyed: bool = False
) -> tuple[Rule, int]:
    """``keyed``: ``entity`` is the time alone (a table with one row per instant)."""
    if keyed or entity:
        key = list(dict.fromkeys([*entity, profile.time.column]))
        dups = frame.height - frame.unique(subset=key).height
        what = f"one row per {', '.join(key)}"
    else:
        key = [c.ident for c in profile.columns]
        dups = profile.duplicate_rows
        what = "no row repeated exactly"
    why = f"{what}; {dups} repeated rows in the table" + (": the repeats quarantined" if dups else "")
    if dups:
        defects.append(f"{dups} repeated rows ({what}) — the repeats quarantined (`one_row_once`)")
    return Rule("one_row_once", {"type": "unique", "columns": key, "severity": "warning", "action": "quarantine",
                                 "max_failure_fraction": budget(dups / profile.rows)}, why, dups), dups  # fmt: skip
