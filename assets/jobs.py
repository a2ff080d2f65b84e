"""The jobs that build a use case's pipeline, in the order its data needs them, generated from its declaration.

The asset graph of a use case has two partitionings (monthly, and none), and three places where they meet:
reference tables feed every month; the drift reference, the model and the whole-period analyses need several
months; the drift reports compare each month with the reference. Each stage is one defined job, named
``<use case>_<stage>`` (``flights_monthly``), so every run of the set-up belongs to a job the UI knows: it shows on
the Overview timeline, can be re-executed, and the monthly jobs fill the assets' partition bars.
``scripts/materialize.py`` launches them in ``build_order``; a person can launch any of them from the UI (a monthly
job for one month, or a backfill over several).

Each run executes its steps in one process (``in_process_executor``): a month is seconds of work, and a process
per step would spend more time importing than working.

Assets tagged ``keel/backfill: skip`` (the experiment data lake and the Flink mirror of a contract, which follow
live traffic or a streaming job) belong to none of these: their own sensors or a person run them.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from assets.usecase import wiring
from keel.usecase import UseCase

ON_DEMAND = dg.AssetSelection.tag("keel/backfill", "skip")

# The run queue's order under load (Dagster's QueuedRunCoordinator launches higher ``dagster/priority`` first): the
# loop's actions (a canary step's deployment) before its evidence (drift reports, challengers) before rebuilding
# deliveries — with two use cases replayed at once, a canary step must not wait behind a queue of monthly rebuilds.
PRIORITY_ACT = {"dagster/priority": "2"}
PRIORITY_JUDGE = {"dagster/priority": "1"}
HISTORY = "history"  # a live replay runs it at the start, on the history months
SENSORS = "sensors"  # a live replay leaves it to the sensors, month by month as data lands
AFTER = "after"  # a live replay runs it once the period is in


@dataclass(frozen=True)
class Stage:
    job: dg.UnresolvedAssetJobDefinition
    partitioned: bool  # one run per month, months in calendar order
    live: str  # what a live replay (scripts/materialize.py --live) does with it: HISTORY, SENSORS or AFTER


@dataclass(frozen=True, eq=False)
class UseCaseJobs:
    """A use case's jobs. ``build_order``: the set-up runs them in this order, one run at a time (tests/test_jobs.py
    proves every parent comes first); months in calendar order, since a month's history features read every earlier
    month and the drift sensor acts on the reports in the order they arrive. ``challenger`` and ``deploy`` are not
    stages: the drift sensor launches the one, the canary sensor the other, in a live replay."""

    build_order: tuple[Stage, ...]
    challenger: dg.UnresolvedAssetJobDefinition
    deploy: dg.UnresolvedAssetJobDefinition  # a canary decision's deployment (the canary sensor's job)

    def stage(self, name: str) -> Stage:
        """The stage whose job is ``<use case>_<name>``."""
        for s in self.build_order:
            if s.job.name.endswith(f"_{name}"):
                return s
        raise KeyError(f"no stage {name!r} in {', '.join(s.job.name for s in self.build_order)}")

    @property
    def monthly(self) -> dg.UnresolvedAssetJobDefinition:
        return self.stage("monthly").job

    @property
    def drift(self) -> dg.UnresolvedAssetJobDefinition:
        return self.stage("drift").job

    @property
    def all(self) -> list[dg.UnresolvedAssetJobDefinition]:
        return [s.job for s in self.build_order] + [self.challenger, self.deploy]


def _job(name: str, selection: dg.AssetSelection, description: str) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        name, executor_def=dg.in_process_executor, selection=selection, description=description
    )


AFTER_TAG = "keel/stage"  # an asset tagged {AFTER_TAG: AFTER} is a whole-period analysis (the causal stage)


def build_jobs(uc: UseCase, assets: tuple[dg.AssetsDefinition | dg.AssetSpec, ...]) -> UseCaseJobs:
    """The jobs over the use case's ``assets`` (assets/pipeline.py: what it generated): a stage whose assets the use
    case does not have (no reference tables, no whole-period analyses) is left out."""
    w = wiring(uc)
    name = uc.name
    keys = {k for a in assets for k in _keys(a)}

    def present(*short: str) -> list[dg.AssetKey]:
        return [w.key(s) for s in short if w.key(s) in keys]

    reference = present(*(f"raw_{src.name}" for src in uc.sources if not src.partitioned))
    stages = []
    if reference:
        stages.append(
            Stage(
                _job(
                    f"{name}_reference_tables",
                    dg.AssetSelection.assets(*reference),
                    f"{uc.title}: the unpartitioned reference tables every month reads.",
                ),
                partitioned=False,
                live=HISTORY,
            )
        )
    stages.append(
        Stage(
            _job(
                f"{name}_monthly",
                dg.AssetSelection.groups(w.group("raw"), w.group("contracts"), w.group("features"))
                - dg.AssetSelection.assets(*reference)
                - ON_DEMAND,
                f"{uc.title}, one month: raw → data contracts (validated + quarantine, with their checks) → "
                "point-in-time features → online store (with skew, distribution and health checks). Months run in "
                "order: each month's history features are built from the months before it.",
            ),
            partitioned=True,
            live=HISTORY,
        )
    )
    stages.append(
        Stage(
            _job(
                f"{name}_models",
                dg.AssetSelection.assets(
                    *present(
                        "drift_reference", uc.model.asset, "model_evaluation", "model_promotion", "model_deployment"
                    )
                ),
                f"{uc.title}: the first model, from {', '.join(uc.monitoring.reference_months)}: the drift reference; "
                f"{uc.model.asset} trained, evaluated behind its quality gate, promoted and deployed to Triton.",
            ),
            partitioned=False,
            live=HISTORY,
        )
    )
    stages.append(
        Stage(
            _job(
                f"{name}_drift",
                dg.AssetSelection.assets(*present("drift_report", "loop_report", "explanations")),
                f"{uc.title}, one month: the drift report against what the serving model was trained on, with a "
                "check per feature (the drift sensor acts on it: freezes, challengers), the month's loop_report on "
                "its realized labels, and its explanations (which features drive the champion's predictions).",
            ),
            partitioned=True,
            live=SENSORS,
        )
    )
    whole_period = sorted((k for a in assets for k in _keys(a) if _tags(a, k).get(AFTER_TAG) == AFTER), key=str)
    if whole_period:
        stages.append(
            Stage(
                _job(
                    f"{name}_causal",
                    dg.AssetSelection.assets(*whole_period),
                    f"{uc.title}: the causal analyses on the whole period: they need every month, so a live replay "
                    "runs them once the period is in.",
                ),
                partitioned=False,
                live=AFTER,
            )
        )
    challenger = _job(
        f"{name}_challenger",
        dg.AssetSelection.assets(*present("challenger_model", "challenger_evaluation")),
        f"{uc.title}: a challenger of the served model, trained on the months the drift sensor's plan names and gated "
        "against the champion on the newest labelled month (run config: train_months, gate_month). Not part of the "
        "set-up: the drift sensor launches it in a live replay.",
    )
    deploy = _job(
        f"{name}_deploy",
        dg.AssetSelection.assets(*present("model_deployment")),
        f"{uc.title}: a canary decision carried out — {uc.model.name} deployed as the policy store now says (a "
        "rollout's start, a step, its promotion or its rollback), the run's log stating the decision and its reasons. "
        "Not part of the set-up: the canary sensor launches it, one run per decision.",
    )
    return UseCaseJobs(tuple(stages), challenger, deploy)


def _keys(a: dg.AssetsDefinition | dg.AssetSpec) -> list[dg.AssetKey]:
    return [a.key] if isinstance(a, dg.AssetSpec) else list(a.keys)


def _tags(a: dg.AssetsDefinition | dg.AssetSpec, key: dg.AssetKey) -> dict[str, str]:
    return dict(a.tags or {}) if isinstance(a, dg.AssetSpec) else dict(a.tags_by_key.get(key, {}))
