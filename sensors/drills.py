"""The weekly chaos drill: a job that runs one drill of keel/chaos.py against the running platform, and the schedule
that runs it every Monday, the drills (and the installed use cases) taking turns (the design articles: a full-chain chaos test every week).

No ``from __future__ import annotations`` here: Dagster reads the op's config class from its annotation.
"""

import json
from datetime import UTC, datetime

import dagster as dg

from keel.clock import SimClock
from resources.home import KeelHomeResource


def drill_of_the_week(when: datetime, live: bool, usecases: tuple[str, ...]) -> tuple[str, str]:
    """(use case, drill): the installed use cases and the drills take turns by ISO week; without a live replay there
    are no deliveries to break, so only the drills on the serving side and the control plane take turns."""
    from keel.chaos import DRILLS

    pool = DRILLS if live else tuple(d for d in DRILLS if d not in ("unit-change", "schema-break"))
    turns = [(uc, drill) for drill in pool for uc in sorted(usecases)]
    return turns[when.isocalendar().week % len(turns)]


class DrillConfig(dg.Config):
    drill: str
    usecase: str  # whose deliveries and model the drill breaks
    timeout_s: float = 900.0


@dg.op(description="Inject the drill's fault and watch the platform undo it (keel.chaos.run_drill); fails when the "
       "platform did not recover in time — the drill found something to fix.")  # fmt: skip
def chaos_drill(context: dg.OpExecutionContext, config: DrillConfig, keel_home: KeelHomeResource) -> None:
    from keel.chaos import run_drill
    from keel.usecase import get

    result = run_drill(config.drill, keel_home.layout(), get(config.usecase), config.timeout_s,
                       progress=context.log.info)  # fmt: skip
    context.log.info(json.dumps(result.as_dict(), default=str))
    if not result.recovered:
        raise dg.Failure(
            f"drill {config.drill}: the platform did not "
            f"{'detect' if not result.detected else 'recover from'} the fault within {config.timeout_s:.0f} s",
            metadata={"incident": result.injection.incident_key},
        )


@dg.job(
    name="keel_chaos_drill",
    description="One chaos drill against the running platform (keel chaos run, as a run): see docs/alerts.md.",
    executor_def=dg.in_process_executor,
)
def chaos_drill_job():
    chaos_drill()


@dg.schedule(
    name="weekly_chaos_drill",
    cron_schedule="0 3 * * 1",
    execution_timezone="UTC",
    job=chaos_drill_job,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Every Monday at 03:00 UTC one chaos drill, the drills taking turns by week (keel/chaos.py): a real "
    "fault the platform must detect, locate and undo by itself; the incident and its alerts follow. Stopped until "
    "an operator starts it (it injects real faults into what is serving). Skips when no model runtime is up.",
)
def weekly_chaos_drill(context: dg.ScheduleEvaluationContext, keel_home: KeelHomeResource):
    home = keel_home.layout()
    if not home.serving.endpoints.exists():
        return dg.SkipReason(f"no model runtime is up ({home.serving.endpoints} is absent): nothing to drill")
    when = context.scheduled_execution_time or datetime.now(UTC)
    from keel.usecase import installed

    usecase, drill = drill_of_the_week(when, SimClock(home.clock).state() is not None, tuple(installed()))
    return dg.RunRequest(
        run_key=f"chaos:{when:%G-W%V}:{usecase}:{drill}",
        run_config={"ops": {"chaos_drill": {"config": {"drill": drill, "usecase": usecase}}}},
        tags={"keel/trigger": "schedule", "keel/drill": drill, "keel/usecase": usecase},
    )
