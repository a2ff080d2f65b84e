"""The jobs that build keel's 2013 pipeline, in the order its data needs them.

The asset graph has two partitionings (monthly, and none), and three places where they meet: reference tables
feed every month; the drift reference, the delay model and the causal analyses need several months; the drift
reports compare each month with the reference. Each stage is one defined job, so every run of the set-up belongs
to a job the UI knows: it shows on the Overview timeline, can be re-executed, and the monthly jobs fill the
assets' partition bars. ``scripts/materialize.py`` launches them in ``BUILD_ORDER``; a person can launch any of
them from the UI (a monthly job for one month, or a backfill over several).

Each run executes its steps in one process (``in_process_executor``): a month is seconds of work, and a process
per step would spend more time importing than working.

Assets tagged ``keel/backfill: skip`` (the experiment data lake and the Flink mirror of the weather contract,
which follow live traffic or a streaming job) belong to none of these: their own sensors or a person run them.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from assets.deployment import MODEL_DEPLOYMENT
from assets.drift import DRIFT_REFERENCE, DRIFT_REPORT
from assets.experiments import IMPACT_PREDICTOR, LOW_VISIBILITY
from assets.explanations import EXPLANATIONS
from assets.loop import CHALLENGER_EVALUATION, CHALLENGER_MODEL, LOOP_REPORT
from assets.models import DELAY_MODEL, MODEL_EVALUATION, MODEL_PROMOTION
from assets.raw import RAW_AIRLINES, RAW_AIRPORTS, RAW_PLANES
from assets.usecase import group

ON_DEMAND = dg.AssetSelection.tag("keel/backfill", "skip")
REFERENCE_TABLES = dg.AssetSelection.assets(RAW_AIRLINES, RAW_AIRPORTS, RAW_PLANES)

reference_tables_job = dg.define_asset_job(
    "keel_reference_tables",
    executor_def=dg.in_process_executor,
    selection=REFERENCE_TABLES,
    description="The unpartitioned reference tables every month reads: airlines, airports, planes.",
)

monthly_job = dg.define_asset_job(
    "keel_monthly",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.groups(group("raw"), group("contracts"), group("features"))
    - REFERENCE_TABLES
    - ON_DEMAND,
    description="One month of NYC 2013 flights: raw → data contracts (validated + quarantine, with their checks) → "
    "point-in-time features → online store (with skew, distribution and health checks). Months run in order: "
    "each month's delay rates are built from the months before it.",
)

models_job = dg.define_asset_job(
    "keel_models",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(
        DRIFT_REFERENCE, DELAY_MODEL, MODEL_EVALUATION, MODEL_PROMOTION, MODEL_DEPLOYMENT
    ),
    description="The first model, from January–March: the drift reference; the delay model trained, evaluated behind "
    "its quality gate, promoted and deployed to Triton.",
)

causal_job = dg.define_asset_job(
    "keel_causal",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(IMPACT_PREDICTOR, LOW_VISIBILITY),
    description="The causal analyses on the whole year (low visibility → delay, its impact predictor): they need "
    "every month, so a live replay runs them once the year is in.",
)

drift_job = dg.define_asset_job(
    "keel_drift",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(DRIFT_REPORT, LOOP_REPORT, EXPLANATIONS),
    description="One month's drift report against what the serving model was trained on, with a check per feature "
    "(the drift sensor acts on it: freezes, challengers), the month's loop_report on its realized labels, and its "
    "explanations (which features drive the champion's predictions, against the reference window).",
)

challenger_job = dg.define_asset_job(
    "keel_challenger",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(CHALLENGER_MODEL, CHALLENGER_EVALUATION),
    description="A challenger of the served model: trained on the months the drift sensor's plan names and gated "
    "against the champion on the newest labelled month (run config: train_months, gate_month). Not part of the "
    "set-up: the drift sensor launches it in a live replay.",
)


HISTORY = "history"  # a live replay runs it at the start, on the history months (January–March)
SENSORS = "sensors"  # a live replay leaves it to the sensors, month by month as data lands
AFTER = "after"  # a live replay runs it once the year is in


@dataclass(frozen=True)
class Stage:
    job: dg.UnresolvedAssetJobDefinition
    partitioned: bool  # one run per month, months in calendar order
    live: str  # what a live replay (scripts/materialize.py --live) does with it: HISTORY, SENSORS or AFTER


# The set-up runs them in this order, one run at a time; tests/test_jobs.py proves every parent comes first.
# Months go in calendar order: a month's delay rates read every earlier month, and the drift sensor acts on the
# reports in the order they arrive (a freeze from November must not outlive December's clean report).
BUILD_ORDER = [
    Stage(reference_tables_job, partitioned=False, live=HISTORY),
    Stage(monthly_job, partitioned=True, live=HISTORY),
    Stage(models_job, partitioned=False, live=HISTORY),
    Stage(drift_job, partitioned=True, live=SENSORS),
    Stage(causal_job, partitioned=False, live=AFTER),
]
build_jobs = [stage.job for stage in BUILD_ORDER]
