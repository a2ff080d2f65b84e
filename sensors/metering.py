"""The metering sensor: each finished day of the gateway's clock is metered once (job ``keel_metering``: usage, then
its cost report), and each budgeted tenant's spend in the current period is judged (keel.metering.budget) — a soft
budget alerts once per period (chat), a spent hard budget pages once (the gateways refuse the tenant meanwhile).

Which days are finished is ``keel.metering.usage.finished_days`` (pure); each tick meters them in one run per run of
days (a single day, or a range: a live replay finishes several simulated days between ticks; two use cases' spans on
one clock are separate runs); the cursor says which days are metered (``MeteredDays``: through a day, and any
after it); run keys name the days, so a replayed cursor never meters a day twice.
"""

from __future__ import annotations

import dagster as dg

from assets.metering import COST_REPORT, METERING_DAYS, metering_job
from keel.alerts import Alert, AlertConfigError, AlertSender
from keel.clock import SimClock
from keel.metering.budget import budget_alert, decide_budget, period_start_day
from keel.metering.compute import day_of
from keel.metering.cost import policy_of_type
from keel.metering.usage import MeteredDays, day_groups, finished_days, logged_days, spend_by_tenant
from keel.policies import PolicyStore
from resources.home import KeelHomeResource
from resources.simulated import SIM_TAG
from sensors.problems import automation_problems

# Dagster's tags for a run over a range of partitions (a single-run backfill); not exported by the public API.
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def judge_budgets(home, now: float, problems: list[str]) -> list[str]:
    """Alert on budgets (once per tenant, period and state); returns what it said, for the tick's log."""
    if not home.policies.exists():
        return []
    with PolicyStore(home.policies) as store:
        budget = policy_of_type(store.state(), "budget")
        if budget is None:
            return []
        first = period_start_day(now, budget.body.get("period", "day"))
        spend = spend_by_tenant(
            [d.root for d in home.serving_dirs()], store, budget.body["tenants"], first, day_of(now)
        )
    said = []
    try:
        sender = AlertSender.for_home(home)
    except AlertConfigError as exc:
        problems.append(f"budget alerts not sent: {exc}")
        return []
    for tenant, spent in sorted(spend.items()):
        decision = decide_budget(tenant, spent, budget.body, now)
        alert = budget_alert(decision) if decision else None
        if alert is None:
            continue
        severity, summary, once = alert
        details = {"tenant": tenant, "spend": round(spent, 6), "limit": decision.limit, "period": decision.period,
                   "currency": decision.currency, "policy_version": budget.version}  # fmt: skip
        if sender.send(Alert("budget", severity, summary, details, source="metering_sensor"), once=once):
            said.append(summary)
    return said


@dg.sensor(
    name="metering_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    jobs=[metering_job],
    description="Meters each finished day of the gateway's clock once (keel_metering: usage → cost_report) and "
    "alerts on per-tenant budgets: soft once per period (chat), a spent hard budget once (page).",
)
def metering_sensor(context: dg.SensorEvaluationContext, keel_home: KeelHomeResource):
    home = keel_home.layout()
    now = SimClock(home.clock).now().timestamp()
    problems: list[str] = []
    for line in judge_budgets(home, now, problems):
        context.log.info(line)
    runtimes = home.serving_dirs()  # every replica's logs
    exposure_days = sorted({d for r in runtimes for d in logged_days(r.exposures, "exposures")})
    cursor = MeteredDays.parse(context.cursor)
    days = finished_days(
        exposure_days, sorted({d for r in runtimes for d in logged_days(r.compute, "compute")}),
        todays(home), cursor.days_done(exposure_days),
    )  # fmt: skip
    outside = [d for d in days if not METERING_DAYS.has_partition_key(d)]
    if outside:  # traffic on a day no use case's span has (assets/metering.py metering_days): said, not a failed run
        context.log.warning(
            f"not metered: traffic logged on {', '.join(outside)}, outside every use case's days (its period and the "
            "days its replay serves on); `keel usage --from … --to …` reads those days from the exposure log"
        )
    events = automation_problems(COST_REPORT, "metering_sensor", problems)
    if not days and not events:
        return dg.SkipReason(f"no finished day to meter (metered through {cursor.through or 'none'})")
    metered = [d for d in days if d not in outside]
    return dg.SensorResult(run_requests=[metering_run(group) for group in day_groups(metered)],
                           cursor=cursor.with_days(days, exposure_days).dump(), asset_events=events)  # fmt: skip


def todays(home) -> list[str]:
    """The day of every clock the gateway logs by: each use case's on a live replay's shared clock (its own time
    span, keel/clock.py), else the one clock's (simulated, or the wall clock)."""
    state = SimClock(home.clock).state()
    names = sorted(state.spans) if state is not None and state.spans else [None]
    return [day_of(SimClock(home.clock, name).now().timestamp()) for name in names]


def metering_run(days: list[str]) -> dg.RunRequest:
    """One run for the days finished since the last tick: the day itself, or the range from the first to the last
    (days between them without traffic are metered as empty). The run key names the range: metered once."""
    ended = {SIM_TAG: f"{days[-1]}T23:59:59+00:00"}  # in a live replay: metered once its last day had ended
    if len(days) == 1:
        return dg.RunRequest(
            run_key=f"metering-{days[0]}", partition_key=days[0], tags={"keel/metered_days": days[0]} | ended
        )
    span = f"{days[0]}..{days[-1]}"
    return dg.RunRequest(
        run_key=f"metering-{span}",
        tags={RANGE_START: days[0], RANGE_END: days[-1],
              "keel/metered_days": span} | ended,
    )  # fmt: skip
