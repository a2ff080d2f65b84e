"""The landing zone of a live replay: the upstream systems deliver 2013 day by day, as the simulated clock passes.

Each local day of flights and of weather becomes one file, ``<root>/<table>/<YYYY-MM-DD>.parquet`` (raw: every
column as text, with ``_source_row``), delivered when the upstream system would have it:

- weather of day D at D+1 06:00 UTC (the last hourly reading of a New York day is at ~05:00 UTC);
- flights of day D at D+1 12:00 UTC — once every flight of D has landed, so its outcome (arrival delay) is known.
  A flight's outcome is never in the zone before it happened.

``deliver(now)`` writes every day due by ``now`` that is not there yet (atomically; a second call with the same
``now`` writes nothing), so a restarted replay picks up where it stopped. Every raw row of a day lands in exactly
that day's file.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import polars as pl

from keel.data.nycflights import YEAR, read_raw
from keel.loop.arrivals import Landed
from keel.storage import write_parquet_atomic

LANDED_TABLES = ("flights", "weather")
DELIVERY = {"weather": timedelta(days=1, hours=6), "flights": timedelta(days=1, hours=12)}  # after local midnight UTC
FIRST_DAY = date(YEAR, 1, 1)
LAST_DAY = date(YEAR, 12, 31)


def due(table: str, day: date) -> datetime:
    """When ``table``'s file for local ``day`` is delivered (UTC)."""
    return datetime.combine(day, time(0), tzinfo=UTC) + DELIVERY[table]


def _days(first: date, last: date):
    d = first
    while d <= last:
        yield d
        d += timedelta(days=1)


class LandingZone:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, table: str, day: date) -> Path:
        if table not in LANDED_TABLES:
            raise ValueError(f"the landing zone holds {', '.join(LANDED_TABLES)}, not {table!r}")
        return self.root / table / f"{day.isoformat()}.parquet"

    def deliver(self, now: datetime, *, first_day: date = FIRST_DAY) -> dict[str, list[date]]:
        """Write every day due by ``now`` (from ``first_day``) that has not landed yet; what landed, per table."""
        out: dict[str, list[date]] = {}
        for table in LANDED_TABLES:
            landed = []
            for day in _days(first_day, LAST_DAY):
                if due(table, day) > now:
                    break
                path = self.path(table, day)
                if path.exists():
                    continue
                write_parquet_atomic(_day_rows(table, day), path)
                landed.append(day)
            out[table] = landed
        return out

    def delivered(self, table: str) -> list[date]:
        folder = self.root / table
        if not folder.exists():
            return []
        return sorted(date.fromisoformat(p.stem) for p in folder.glob("*.parquet"))

    def landed_by_month(self) -> dict[str, Landed]:
        """Per month ``YYYY-MM``: how many days of flights and of weather have landed."""
        out: dict[str, list[int]] = {}
        for i, table in enumerate(LANDED_TABLES):
            for d in self.delivered(table):
                out.setdefault(f"{d.year}-{d.month:02d}", [0, 0])[i] += 1
        return {m: Landed(flight_days=c[0], weather_days=c[1]) for m, c in out.items()}

    def read_month(self, table: str, month_key: str, days: list[date] | None = None) -> pl.DataFrame:
        """The landed days of month ``YYYY-MM`` (possibly a partial month; only ``days`` when given), in delivery
        row order."""
        year, month = (int(x) for x in month_key.split("-"))
        wanted = self.delivered(table) if days is None else sorted(days)
        files = [self.path(table, d) for d in wanted if (d.year, d.month) == (year, month)]
        if not files:
            return read_raw(table).clear()
        return pl.concat([pl.read_parquet(f) for f in files]).sort("_source_row")

    def month_complete(self, table: str, month_key: str) -> bool:
        year, month = (int(x) for x in month_key.split("-"))
        first = date(year, month, 1)
        last = date(year + (month == 12), month % 12 + 1, 1) - timedelta(days=1)
        have = set(self.delivered(table))
        return all(d in have for d in _days(first, last))

    def complete_months(self, table: str = "flights") -> tuple[str, ...]:
        """The months whose every day of ``table`` has landed — for flights: the months whose outcomes are all known
        (a flight's day lands once all its flights have arrived), i.e. the labelled months."""
        months = sorted({f"{d.year}-{d.month:02d}" for d in self.delivered(table)})
        return tuple(m for m in months if self.month_complete(table, m))


def _day_rows(table: str, day: date) -> pl.DataFrame:
    raw = read_raw(table)
    return raw.filter(
        (pl.col("year") == str(day.year)) & (pl.col("month") == str(day.month)) & (pl.col("day") == str(day.day))
    )
