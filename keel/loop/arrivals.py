"""New data in the landing zone → which months to rebuild, and which are complete enough to judge for drift.

Pure: ``arrivals(landed, seen)`` compares what has landed (per month: days of each landed table, the outcomes table
first) with what the pipeline was last asked to build, and returns one ``MonthRefresh`` per month with new days — the
month's key and a run key that names exactly what landed, so the same delivery never launches two runs (a restarted
daemon, a replayed cursor). A month whose every day of the outcomes table has landed is ``complete``: its drift
report can be judged.
"""

from __future__ import annotations

from calendar import monthrange
from dataclasses import dataclass


@dataclass(frozen=True)
class Landed:
    """Days landed of each table of the landing zone (``LandingZone.tables`` order: the outcomes table first)."""

    days: tuple[int, ...]

    @property
    def outcome_days(self) -> int:
        return self.days[0]


@dataclass(frozen=True)
class MonthRefresh:
    month: str
    landed: Landed
    complete: bool

    @property
    def run_key(self) -> str:
        return f"landing:{self.month}:{'-'.join(map(str, self.landed.days))}"


def days_in(month: str) -> int:
    year, m = (int(x) for x in month.split("-"))
    return monthrange(year, m)[1]


def arrivals(landed: dict[str, Landed], seen: dict[str, Landed]) -> list[MonthRefresh]:
    """Months (in calendar order) with days that landed since ``seen``; months without a day of the outcomes table
    yet are skipped (a month's features need its entities)."""
    out = []
    for month in sorted(landed):
        now = landed[month]
        if now.outcome_days == 0 or seen.get(month) == now:
            continue
        out.append(MonthRefresh(month, now, complete=now.outcome_days >= days_in(month)))
    return out
