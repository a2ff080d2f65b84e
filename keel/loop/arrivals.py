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
        return delivery_key(self.month, self.landed)


def days_in(month: str) -> int:
    year, m = (int(x) for x in month.split("-"))
    return monthrange(year, m)[1]


def arrivals(landed: dict[str, Landed], seen: dict[str, Landed], batch_days: int = 1) -> list[MonthRefresh]:
    """Months (in calendar order) with days that landed since ``seen``; months without a day of the outcomes table
    yet are skipped (a month's features need its entities). ``batch_days`` > 1 (a stepped replay, keel/clock.py):
    a month is rebuilt only once that many new days of its outcomes table wait, or when it is complete — the same
    deliveries go together on every machine, where a replay on the wall clock coalesces them by load."""
    if batch_days < 1:
        raise ValueError(f"batch_days must be ≥ 1, got {batch_days}")
    out = []
    for month in sorted(landed):
        now, before = landed[month], seen.get(month)
        if now.outcome_days == 0 or before == now:
            continue
        complete = now.outcome_days >= days_in(month)
        new_days = now.outcome_days - (before.outcome_days if before else 0)
        if batch_days > 1 and not complete and new_days < batch_days:
            continue  # waits for its batch
        out.append(MonthRefresh(month, now, complete=complete))
    return out


def delivery_key(month: str, landed: Landed) -> str:
    """The run key of the monthly rebuild of ``month`` with ``landed`` days (what the landing sensor requests)."""
    return f"landing:{month}:{'-'.join(map(str, landed.days))}"


def built_whole(month: str, landed: Landed, built_key: str | None) -> bool:
    """Were the month's features last built from all it has landed? ``built_key``: the delivery the last build of
    the month read (its run's delivery tag); None: never built. Not built, or built from an earlier, partial delivery
    — the complete one still queued on a busy machine —, is not: a gate on that month would judge a month still
    being built, or find none. A build that is not a delivery's (a backfill, a rebuild) read every landed day."""
    if built_key is None:
        return False
    if not built_key.startswith("landing:"):
        return True
    return built_key == delivery_key(month, landed)
