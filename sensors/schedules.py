"""The production cadence as Dagster schedules (the design articles: drift detection every night, a full-chain
chaos test every week).

``<use case>_nightly_drift`` looks every night at 02:00 UTC for the newest complete month (a monthly partition exists once its
month has ended) and runs ``<use case>_drift`` for it unless that month has a drift report already; the drift sensor acts
on the report as on any other. So a month is judged the night after it ends, once (the run key names the month),
and a night with nothing new is a skip that says so. In a live replay it skips: the same job runs on the simulated
clock there, from the landing sensor, as each month completes (a replayed night lasts seconds).

``weekly_chaos_drill`` (sensors/drills.py; stopped until an operator starts it) runs one drill of keel/chaos.py
every Monday.
"""

from __future__ import annotations

from datetime import datetime

import dagster as dg

from assets.jobs import UseCaseJobs
from assets.usecase import wiring
from keel.clock import SimClock
from keel.usecase import UseCase, plays
from resources.home import KeelHomeResource


def newest_complete_month(partitions: dg.PartitionsDefinition, now: datetime) -> str | None:
    """The newest monthly partition whose month has ended by ``now`` (None before the first)."""
    keys = partitions.get_partition_keys(current_time=now)
    return keys[-1] if keys else None


def build_nightly_drift(uc: UseCase, jobs: UseCaseJobs) -> dg.ScheduleDefinition:
    """``<use case>_nightly_drift``: the use case's drift report of its newest complete month, once."""
    w = wiring(uc)
    report = w.key("drift_report")
    drift_job = jobs.drift

    @dg.schedule(
        name=f"{uc.name}_nightly_drift",
        cron_schedule="0 2 * * *",
        execution_timezone="UTC",
        job=drift_job,
        default_status=dg.DefaultScheduleStatus.RUNNING if plays(uc.name) else dg.DefaultScheduleStatus.STOPPED,
        description=f"{uc.title}, every night at 02:00 UTC: the drift report of the newest complete month, once "
        f"(the drift sensor acts on it). Skips when that month is reported already, and in a live replay (the "
        f"landing sensor drives {drift_job.name} on the simulated clock there).",
    )
    def _schedule(context: dg.ScheduleEvaluationContext, keel_home: KeelHomeResource):
        clock = SimClock(keel_home.layout().clock, uc.name)
        if clock.state() is not None:
            return dg.SkipReason(
                f"a live replay runs: the landing sensor drives {drift_job.name} on the simulated clock"
            )
        now = context.scheduled_execution_time or clock.now()
        month = newest_complete_month(w.monthly, now)
        if month is None:
            return dg.SkipReason(f"no month of {uc.name} has ended by {now:%Y-%m-%d}")
        reported = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=report, asset_partitions=[month]), limit=1
        ).records
        if reported:
            return dg.SkipReason(f"{month}, the newest complete month, has its drift report already")
        return dg.RunRequest(
            run_key=f"nightly_drift:{month}", partition_key=month, tags={"keel/trigger": "schedule"}
        )  # fmt: skip

    return _schedule
