"""The landing zone of a live replay: the upstream systems deliver a use case's data day by day, as the simulated
clock passes.

Each local day of each landed source (``UseCase.landed``: the sources with ``landing_after``) becomes one file,
``<root>/<use case>/<table>/<YYYY-MM-DD>.parquet`` (raw: every column as text, with ``_source_row``), delivered when the
upstream system would have it: at the day's midnight (UTC) plus the source's ``landing_after`` — for the table that
holds the outcomes, once every outcome of the day is known, so an outcome is never in the zone before it happened.

``deliver(now)`` writes every day due by ``now`` that is not there yet (atomically; a second call with the same
``now`` writes nothing), so a restarted replay picks up where it stopped. Every raw row of a day lands in exactly
that day's file — a data drill's planted change (``$KEEL_HOME/landing/plants.json``, keel/data/plants.py) changes
values of the rows it chose, never which rows land.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import polars as pl

from keel.data.plants import check_plants, read_plants
from keel.loop.arrivals import Landed
from keel.storage import write_parquet_atomic
from keel.usecase import Source, UseCase


def _days(first: date, last: date):
    d = first
    while d <= last:
        yield d
        d += timedelta(days=1)


def month_end(month_key: str) -> date:
    """The last day of month ``YYYY-MM``."""
    year, month = (int(x) for x in month_key.split("-"))
    return date(year + (month == 12), month % 12 + 1, 1) - timedelta(days=1)


class LandingZone:
    def __init__(self, root: str | Path, usecase: UseCase):
        if usecase.period is None or not usecase.landed:
            raise ValueError(f"use case {usecase.name} declares no period or no landed sources: nothing lands")
        self.root = Path(root) / usecase.name  # each use case's deliveries in a folder of its own
        self.usecase = usecase
        self.first_day, self.last_day = usecase.period
        self.tables = tuple(src.name for src in usecase.landed)  # the outcomes table first
        # a data drill's planted changes (keel/data/plants.py), applied as the days land
        self.plants = tuple(p for p in read_plants(Path(root)) if p.usecase == usecase.name)
        check_plants(self.plants, usecase.name, self.tables, Path(root))

    def _source(self, table: str) -> Source:
        if table not in self.tables:
            raise ValueError(f"the landing zone holds {', '.join(self.tables)}, not {table!r}")
        return self.usecase.source(table)

    @property
    def outcomes_table(self) -> str:
        return self.tables[0]

    def due(self, table: str, day: date) -> datetime:
        """When ``table``'s file for local ``day`` is delivered (UTC)."""
        return datetime.combine(day, time(0), tzinfo=UTC) + self._source(table).landing_after

    def landed_by(self, day: date) -> datetime:
        """When every table's file for local ``day`` has been delivered (UTC)."""
        return max(self.due(table, day) for table in self.tables)

    def history_landed(self) -> datetime:
        """When the use case's history (``UseCase.history_months``) has landed: where a live replay's clock starts."""
        if not self.usecase.history_months:
            raise ValueError(f"use case {self.usecase.name} declares no first-model months: no history to start from")
        return self.landed_by(month_end(self.usecase.history_months[-1]))

    def path(self, table: str, day: date) -> Path:
        self._source(table)
        return self.root / table / f"{day.isoformat()}.parquet"

    def deliver(self, now: datetime, *, first_day: date | None = None) -> dict[str, list[date]]:
        """Write every day due by ``now`` (from ``first_day``) that has not landed yet; what landed, per table."""
        out: dict[str, list[date]] = {}
        for table in self.tables:
            landed = []
            for day in _days(first_day or self.first_day, self.last_day):
                if self.due(table, day) > now:
                    break
                path = self.path(table, day)
                if path.exists():
                    continue
                write_parquet_atomic(self.day_rows(table, day), path)
                landed.append(day)
            out[table] = landed
        return out

    def day_rows(self, table: str, day: date) -> pl.DataFrame:
        """The rows of ``table`` that land as local ``day``'s file."""
        src = self._source(table)
        rows = src.read().filter(src.day_rows(day))
        for plant in self.plants:
            if plant.applies(self.usecase.name, table, day):
                rows = plant.apply(rows)
        return rows

    def delivered(self, table: str) -> list[date]:
        folder = self.root / table
        if not folder.exists():
            return []
        return sorted(date.fromisoformat(p.stem) for p in folder.glob("*.parquet"))

    def landed_by_month(self) -> dict[str, Landed]:
        """Per month ``YYYY-MM``: how many days of each landed table (in ``tables`` order) have landed."""
        out: dict[str, list[int]] = {}
        for i, table in enumerate(self.tables):
            for d in self.delivered(table):
                out.setdefault(f"{d.year}-{d.month:02d}", [0] * len(self.tables))[i] += 1
        return {m: Landed(tuple(c)) for m, c in out.items()}

    def read_month(self, table: str, month_key: str, days: list[date] | None = None) -> pl.DataFrame:
        """The landed days of month ``YYYY-MM`` (possibly a partial month; only ``days`` when given), in delivery
        row order."""
        year, month = (int(x) for x in month_key.split("-"))
        wanted = self.delivered(table) if days is None else sorted(days)
        files = [self.path(table, d) for d in wanted if (d.year, d.month) == (year, month)]
        if not files:
            return self._source(table).read().clear()
        return pl.concat([pl.read_parquet(f) for f in files]).sort("_source_row")

    def month_complete(self, table: str, month_key: str) -> bool:
        year, month = (int(x) for x in month_key.split("-"))
        first, last = date(year, month, 1), month_end(month_key)
        have = set(self.delivered(table))
        return all(d in have for d in _days(first, last))

    def complete_months(self, table: str | None = None) -> tuple[str, ...]:
        """The months whose every day of ``table`` (default: the outcomes table) has landed — for the outcomes
        table: the months whose outcomes are all known, i.e. the labelled months."""
        table = table or self.outcomes_table
        months = sorted({f"{d.year}-{d.month:02d}" for d in self.delivered(table)})
        return tuple(m for m in months if self.month_complete(table, m))
