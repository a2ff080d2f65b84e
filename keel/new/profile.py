"""The profile of a table ``keel new`` starts from: what each column holds, read from text the way a contract reads it.

A column's *kind* is the narrowest type every non-null value parses as — ``bool`` (true/false), ``int``, ``float``,
``datetime`` or ``date`` (one of ``DATETIME_FORMATS``/``DATE_FORMATS``; in the time column, ``COMPACT_DATE`` too), else
``string``. Text that stands for nothing in an otherwise typed column (``NA`` as R writes it, ``NaN``, ``null``) is
counted as null and named, so the reader can say it. Per column: nulls, distinct values, quantiles and range
(numbers), categories and their counts (text, booleans and small integers); for the table: rows, exact duplicate rows,
and the time column's span, cadence (the median step between distinct instants) and gaps (stretches with no row that
the cadence says should have one).
Pure: a frame of text in, a value out (``profile_table``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta

import polars as pl

from keel.names import column_identifier

NULL_TOKENS = ("NA", "N/A", "NaN", "nan", "null", "NULL", "None", "none", "-")
DATE_FORMATS = ("%Y-%m-%d", "%Y/%m/%d", "%m/%d/%Y", "%d.%m.%Y")
COMPACT_DATE = "%Y%m%d"  # 20130101: read as a date only in the column named as the time (elsewhere it is a number)
DATETIME_FORMATS = (
    "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z", "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M",
)  # fmt: skip
QUANTILES = (0.001, 0.01, 0.25, 0.5, 0.75, 0.99, 0.999)
TOP = 40  # categories kept per column
MIN_GAP_DAYS = 3  # fewer missing days in a row are a holiday or a long weekend, not a gap
GAP_MONTH_DAYS = 7  # a month missing this many days to gaps is not one to validate a model on
CADENCES = ((3600, "hourly"), (86400, "daily"), (7 * 86400, "weekly"), (28 * 86400, "monthly"))
_INT = re.compile(r"^[+-]?\d{1,18}$")


identifier = column_identifier  # a column name as a keel identifier (keel/names.py)


@dataclass(frozen=True)
class ColumnProfile:
    name: str  # as written in the file
    ident: str  # as keel names it
    kind: str  # bool | int | float | date | datetime | string
    rows: int
    nulls: int  # empty, or one of null_tokens
    distinct: int
    fmt: str | None = None  # the strptime format of a date or datetime column
    null_tokens: tuple[str, ...] = ()  # the text that stands for null here ("NA")
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    quantiles: dict[str, float] = field(default_factory=dict)  # "0.001" → value
    positive: tuple[float, float] | None = None  # p1 and p99 of the values above 0 (a column never negative)
    categories: tuple[tuple[str, int], ...] = ()  # (value, rows), most frequent first (TOP at most)
    first: str | None = None  # date/datetime: the earliest and latest value, ISO
    last: str | None = None

    @property
    def null_share(self) -> float:
        return self.nulls / self.rows if self.rows else 0.0

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def temporal(self) -> bool:
        return self.kind in ("date", "datetime")

    def q(self, p: float) -> float:
        return self.quantiles[f"{p:g}"]


@dataclass(frozen=True)
class TimeProfile:
    column: str  # the identifier of the time column
    first: date
    last: date
    cadence: str  # hourly | daily | weekly | monthly | irregular
    step_s: float  # the median step between distinct instants, seconds
    rows_per_day: float  # median rows on a day that has rows
    gaps: tuple[
        tuple[date, date], ...
    ]  # first and last day of each stretch with no row where the cadence expects some
    months: tuple[str, ...]  # YYYY-MM of every month from first to last
    rows_per_month: dict[str, int]
    # an hourly table: the hours without a row outside the day gaps, and their stretches (first, last, hours) longest
    # first — a day with 20 of its 24 hours is no gap, but 4 missing hours are (issue 61 item 11)
    missing_hours: int = 0
    missing_stretches: tuple[tuple[str, str, int], ...] = ()

    @property
    def gap_days(self) -> int:
        return sum((b - a).days + 1 for a, b in self.gaps)

    def gap_months(self, min_days: int = GAP_MONTH_DAYS) -> set[str]:
        """The months that miss at least ``min_days`` days of rows to gaps (too few to validate a model on)."""
        missing: dict[str, int] = {}
        for a, b in self.gaps:
            d = a
            while d <= b:
                key = f"{d.year}-{d.month:02d}"
                missing[key] = missing.get(key, 0) + 1
                d += timedelta(days=1)
        return {m for m, n in missing.items() if n >= min_days}


@dataclass(frozen=True)
class TableProfile:
    rows: int
    columns: tuple[ColumnProfile, ...]
    duplicate_rows: int  # rows that repeat an earlier row exactly
    time: TimeProfile

    def column(self, ident: str) -> ColumnProfile:
        for c in self.columns:
            if c.ident == ident or c.name == ident:
                return c
        raise KeyError(ident)

    def to_dict(self) -> dict:
        return asdict(self)


def _non_null(s: pl.Series) -> pl.Series:
    return s.drop_nulls().str.strip_chars()


def _parses(values: pl.Series, kind: str, fmt: str | None = None) -> bool:
    if values.len() == 0:
        return False
    if kind == "bool":
        return bool(values.str.to_lowercase().is_in(["true", "false"]).all())
    if kind == "int":
        return bool(values.str.contains(_INT.pattern).all())
    if kind == "float":
        return values.cast(pl.Float64, strict=False).null_count() == 0
    dtype = pl.Date if kind == "date" else pl.Datetime("us")
    try:
        return values.str.strptime(dtype, fmt, strict=False).null_count() == 0
    except pl.exceptions.ComputeError:
        return False


def infer_kind(text: pl.Series, time: bool = False) -> tuple[str, str | None, tuple[str, ...]]:
    """(kind, format, null tokens) of a text column; ``time``: the column named as the table's time, where eight
    digits that all parse as ``COMPACT_DATE`` are a date."""
    values = _non_null(text)
    values = values.filter(values != "")
    tokens = tuple(t for t in NULL_TOKENS if bool((values == t).any()))
    typed = values.filter(~values.is_in(list(tokens))) if tokens else values
    if time and typed.len() and bool(typed.str.contains(r"^\d{8}$").all()) and _parses(typed, "date", COMPACT_DATE):
        return "date", COMPACT_DATE, tokens
    for kind in ("bool", "int", "float"):
        if _parses(typed, kind):
            return kind, None, tokens
    for fmt in DATETIME_FORMATS:
        if _parses(typed, "datetime", fmt):
            return "datetime", fmt, tokens
    for fmt in DATE_FORMATS:
        if _parses(typed, "date", fmt):
            return "date", fmt, tokens
    return "string", None, ()  # "NA" in a text column may be a value (Namibia): not guessed


def _typed(text: pl.Series, kind: str, fmt: str | None, tokens: tuple[str, ...]) -> pl.Series:
    stripped = pl.col(text.name).str.strip_chars()
    s = text.to_frame().select(pl.when(stripped.is_in(["", *tokens])).then(None).otherwise(stripped).alias(text.name))
    s = s.to_series()
    if kind == "bool":
        return s.str.to_lowercase() == "true"
    if kind == "int":
        return s.cast(pl.Int64, strict=False)
    if kind == "float":
        return s.cast(pl.Float64, strict=False)
    if kind == "date":
        return s.str.strptime(pl.Date, fmt, strict=False)
    if kind == "datetime":
        parsed = s.str.strptime(pl.Datetime("us"), fmt, strict=False)
        return parsed.dt.convert_time_zone("UTC") if "%z" in (fmt or "") else parsed
    return s


def profile_column(
    text: pl.Series, file_tokens: tuple[str, ...] = (), time: bool = False
) -> tuple[ColumnProfile, pl.Series]:
    """One column's profile and its typed values; ``file_tokens``: the file's own words for a missing value, applied
    to a text column too (a text column alone never has its "NA" guessed away: it may be Namibia); ``time``: the
    column is the table's time (``infer_kind``)."""
    kind, fmt, tokens = infer_kind(text, time)
    if kind == "string" and file_tokens:
        tokens = tuple(t for t in file_tokens if bool((text.str.strip_chars() == t).any()))
    typed = _typed(text, kind, fmt, tokens)
    base = dict(name=text.name, ident=identifier(text.name), kind=kind, rows=text.len(), nulls=typed.null_count(),
                distinct=typed.drop_nulls().n_unique(), fmt=fmt, null_tokens=tokens)  # fmt: skip
    extra: dict = {}
    values = typed.drop_nulls()
    if kind in ("int", "float") and values.len():
        extra |= {
            "min": float(values.min()), "max": float(values.max()), "mean": float(values.mean()),
            "quantiles": {f"{p:g}": float(values.quantile(p, "linear")) for p in QUANTILES},
        }  # fmt: skip
        above = values.filter(values > 0)
        if float(values.min()) >= 0 and above.len():
            extra["positive"] = (float(above.quantile(0.01, "linear")), float(above.quantile(0.99, "linear")))
    if kind in ("string", "bool") or (kind == "int" and base["distinct"] <= 12):
        counts = values.cast(pl.String).value_counts(sort=True).head(TOP)
        extra["categories"] = tuple(zip(counts[text.name].to_list(), counts["count"].to_list(), strict=True))
    if kind in ("date", "datetime") and values.len():
        extra |= {"first": values.min().isoformat(), "last": values.max().isoformat()}
    return ColumnProfile(**base, **extra), typed


def _cadence(step_s: float) -> str:
    for limit, name in CADENCES:
        if step_s <= limit * 1.5:
            return name
    return "irregular"


def profile_time(ident: str, typed: pl.Series) -> TimeProfile:
    instants = typed.drop_nulls()
    if instants.len() < 2:
        raise ValueError(f"time column {ident}: fewer than two values that parse as a date or a time")
    days = (instants.dt.date() if instants.dtype != pl.Date else instants).alias("day")
    distinct = instants.unique().sort()
    steps = distinct.diff().drop_nulls()
    step_s = float(steps.dt.total_seconds().median()) if steps.len() else 86400.0
    cadence = _cadence(step_s)
    per_day = days.value_counts()
    day_list = sorted(per_day["day"].to_list())
    expected = max(timedelta(days=1), timedelta(seconds=step_s))
    # a table with (almost) no row on Saturdays and Sundays is kept on business days: a weekend is no gap
    weekdays = pl.Series(day_list, dtype=pl.Date).dt.weekday()
    business = cadence == "daily" and float((weekdays >= 6).mean()) < 0.01
    if business:
        cadence = "business days"
    gaps = []
    for a, b in zip(day_list, day_list[1:], strict=False):
        if cadence in ("hourly", "daily", "business days"):
            missing = [a + timedelta(days=i) for i in range(1, (b - a).days)]
            if business:
                missing = [d for d in missing if d.isoweekday() < 6]
            if len(missing) >= MIN_GAP_DAYS:
                gaps.append((a + timedelta(days=1), b - timedelta(days=1)))
        elif cadence in ("weekly", "monthly") and (b - a) > expected * 1.5 + timedelta(days=3):
            gaps.append((a + timedelta(days=1), b - timedelta(days=1)))
    first, last = day_list[0], day_list[-1]
    months, d = [], date(first.year, first.month, 1)
    while d <= last:
        months.append(f"{d.year}-{d.month:02d}")
        d = date(d.year + d.month // 12, d.month % 12 + 1, 1)
    by_month = days.dt.strftime("%Y-%m").value_counts()
    missing_hours, stretches = _missing_hours(instants, gaps) if cadence == "hourly" else (0, ())
    return TimeProfile(
        column=ident,
        first=first,
        last=last,
        cadence=cadence,
        step_s=step_s,
        rows_per_day=float(per_day["count"].median()),
        gaps=tuple(gaps),
        months=tuple(months),
        rows_per_month=dict(zip(by_month["day"].to_list(), by_month["count"].to_list(), strict=True)),
        missing_hours=missing_hours,
        missing_stretches=stretches,
    )


def _missing_hours(instants: pl.Series, gaps) -> tuple[int, tuple[tuple[str, str, int], ...]]:
    """The hours from the first to the last instant with no row, outside the day ``gaps``; their stretches."""
    hours = instants.dt.truncate("1h").unique().sort()
    expected = pl.datetime_range(hours[0], hours[-1], "1h", eager=True, time_unit=hours.dtype.time_unit)
    missing = expected.filter(~expected.is_in(hours.implode()))
    if missing.len() == 0:
        return 0, ()
    day = missing.dt.date()
    outside = pl.Series([True] * missing.len())
    for a, b in gaps:
        outside = outside & ~((day >= a) & (day <= b))
    missing = missing.filter(outside)
    if missing.len() == 0:
        return 0, ()
    run = (missing.diff().dt.total_seconds().fill_null(3600) != 3600).cum_sum()
    runs = (
        pl.DataFrame({"h": missing, "run": run})
        .group_by("run")
        .agg(pl.col("h").min().alias("first"), pl.col("h").max().alias("last"), pl.len().alias("n"))
        .sort(["n", "first"], descending=[True, False])
    )
    shown = tuple((str(a)[:16], str(b)[:16], int(n)) for a, b, n in runs.select("first", "last", "n").iter_rows())
    return int(missing.len()), shown


def profile_table(text: pl.DataFrame, time: str) -> tuple[TableProfile, pl.DataFrame]:
    """Profile a table read as text; ``time``: its time column (as written, or its identifier). The profile and the
    table typed as profiled (columns renamed to their identifiers)."""
    columns, typed = [], {}
    for name in text.columns:
        col, values = profile_column(text[name].cast(pl.String), time=time in (name, identifier(name)))
        columns.append(col)
        typed[col.ident] = values
    # the text a file writes for a missing number (R's NA) is its convention for a missing text too
    file_tokens = tuple(sorted({t for c in columns for t in c.null_tokens}))
    for i, col in enumerate(columns):
        if col.kind == "string" and file_tokens and text[col.name].cast(pl.String).is_in(list(file_tokens)).any():
            columns[i], typed[col.ident] = profile_column(text[col.name].cast(pl.String), file_tokens)
    idents = [c.ident for c in columns]
    dup = sorted({i for i in idents if idents.count(i) > 1})
    if dup:
        raise ValueError(f"columns {dup} have the same name once lower-cased and cleaned: rename them in the file")
    frame = pl.DataFrame(typed)
    matches = [c for c in columns if time in (c.name, c.ident)]
    if not matches:
        raise ValueError(f"time column {time!r} is not in the table (its columns: {', '.join(text.columns)})")
    tcol = matches[0]
    if not tcol.temporal:
        raise ValueError(
            f"time column {time!r} holds {tcol.kind} values, not dates or times in a format keel reads "
            f"({', '.join((*DATE_FORMATS, *DATETIME_FORMATS, COMPACT_DATE))})"
        )
    return (
        TableProfile(
            rows=text.height,
            columns=tuple(columns),
            duplicate_rows=text.height - text.unique().height,
            time=profile_time(tcol.ident, frame[tcol.ident]),
        ),
        frame,
    )


def describe(p: TableProfile) -> str:
    """The profile as a person reads it (``keel new --dry-run``)."""
    t = p.time
    lines = [
        f"{p.rows:,} rows, {len(p.columns)} columns, {p.duplicate_rows:,} exact duplicate rows",
        f"time: {t.column} {t.first} … {t.last} ({len(t.months)} months), {t.cadence} "
        f"(median step {t.step_s / 3600:g} h), median {t.rows_per_day:g} rows a day, "
        + (f"{len(t.gaps)} gaps ({t.gap_days} days without rows)" if t.gaps else "no gaps"),
    ]
    for a, b in t.gaps[:8]:
        lines.append(f"  gap: {a} … {b}")
    lines.append(f"{'column':<28} {'kind':<9} {'nulls':>7} {'distinct':>9}  values")
    for c in p.columns:
        if c.numeric and c.quantiles:
            shown = f"min {c.min:g}  p1 {c.q(0.01):g}  median {c.q(0.5):g}  p99 {c.q(0.99):g}  max {c.max:g}"
        elif c.temporal:
            shown = f"{c.first} … {c.last} ({c.fmt})"
        else:
            shown = ", ".join(f"{v} {n}" for v, n in c.categories[:6]) + (" …" if c.distinct > 6 else "")
        nulls = f"{c.nulls}" + (f" ({'/'.join(c.null_tokens)})" if c.null_tokens else "")
        lines.append(f"{c.ident:<28} {c.kind:<9} {nulls:>7} {c.distinct:>9}  {shown}")
    return "\n".join(lines)
