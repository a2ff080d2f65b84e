"""The loop's assets: what a drift report leads to — a challenger trained on the most recent labelled months, and its
gate against the champion on the newest labelled month neither trained on.

    drift_report ─► challenger_model ─► challenger_evaluation (check: challenger_gate) ─► canary (policy store)
                                                                                          ─► model_deployment

The drift sensor decides *whether* and *on which months* (keel.loop.retrain.plan_retrain) and launches
``keel_challenger`` with those months as run config; these assets do the work and record it; the canary sensor
starts a canary for a challenger whose gate passed (keel.loop.gate.challenger_gate). Both read the months' feature
files as the pipeline stored them, so a window is any months that exist, not a partition mapping fixed in code.
"""

from datetime import UTC

import dagster as dg
import polars as pl

from assets.deployment import MODEL_DEPLOYMENT
from assets.drift import DRIFT_REPORT
from assets.features import FEATURE_CODE_VERSION, FLIGHT_FEATURES
from assets.models import MODEL_NAME, run_id_of
from assets.partitions import monthly_2013
from assets.usecase import group, key
from keel.home import KeelHome, asset_file
from keel.loop.gate import DEFAULT_GATE, challenger_gate
from keel.loop.report import Release, month_report, naive_window
from keel.training.model import TrainingConfig, month_of, predict, train_model
from resources.home import KeelHomeResource
from resources.ledger import LedgerResource
from resources.registry import ModelRegistryResource
from usecases.flights import usecase as FLIGHTS

LOOP_GROUP = group("loop")
CHALLENGER_MODEL = key("challenger_model")
CHALLENGER_EVALUATION = key("challenger_evaluation")
# The ops a keel_challenger run configures (their run config is keyed by op name: the key as an identifier).
CHALLENGER_OPS = (CHALLENGER_MODEL.to_python_identifier(), CHALLENGER_EVALUATION.to_python_identifier())
CHALLENGER_GATE = "challenger_gate"


class ChallengerConfig(dg.Config):
    """What the drift sensor's plan says (keel.loop.retrain.RetrainPlan): the months it is fitted on, the newest
    labelled month — early-stopped on its days before ``gate_from_day``, judged on the days from it — and the drift
    that asked for it."""

    train_months: list[str]
    gate_month: str
    gate_from_day: int = 22
    drift_window: str = ""
    drift_event: int = 0


def gate_flights(frame: pl.DataFrame, config: ChallengerConfig) -> pl.DataFrame:
    """The flights that judge the challenger: the gate month's days from ``gate_from_day`` on."""
    return month_of(frame, config.gate_month).filter(pl.col("sched_date").dt.day() >= config.gate_from_day)


def read_months(home: KeelHome, months: list[str]) -> pl.DataFrame:
    """The stored flight_features partitions of ``months``; a missing one is an error that names it."""
    paths = [asset_file(home.storage, list(FLIGHT_FEATURES.path), m) for m in months]
    missing = [m for m, p in zip(months, paths, strict=True) if not p.exists()]
    if missing:
        raise dg.Failure(f"flight_features has no stored partition for {', '.join(missing)}: materialize it first")
    return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")


@dg.asset(
    key=CHALLENGER_MODEL,
    group_name=LOOP_GROUP,
    kinds={"lightgbm"},
    deps=[DRIFT_REPORT],
    tags={"keel/backfill": "skip"},
    description="A challenger of the served delay model, trained when drift asks for one (the drift sensor's plan: "
    "fitted on the three labelled months before the newest, early-stopped on the newest month's first three weeks). "
    "Registered in the registry with its window and the drift report that asked for it. Launched by the drift "
    "sensor in a live replay (`keel_challenger`), or from the Launchpad with the months as config.",
)
def challenger_model(
    context: dg.AssetExecutionContext,
    config: ChallengerConfig,
    registry: ModelRegistryResource,
    keel_home: KeelHomeResource,
) -> dg.Output[pl.DataFrame]:
    if not config.train_months:
        raise dg.Failure("train_months is empty: a challenger needs months to be fitted on")
    if config.gate_month in config.train_months:
        raise dg.Failure(f"gate month {config.gate_month} is in the training window: the gate would not be fair")
    if not 2 <= config.gate_from_day <= 28:
        raise dg.Failure(f"gate_from_day {config.gate_from_day}: must be 2…28 (early-stop before it, judge from it)")
    training = TrainingConfig(
        train_months=tuple(config.train_months),
        valid_month=config.gate_month,
        valid_days=(1, config.gate_from_day - 1),
    )
    features = read_months(keel_home.layout(), [*config.train_months, config.gate_month])
    model = train_model(features, training)
    run_id = run_id_of(context)
    with registry.open() as reg:
        reg.register(
            MODEL_NAME,
            model.text,
            {
                "train_months": list(training.train_months),
                "valid_month": training.valid_month,
                "valid_days": list(training.valid_days),
                "gate_month": config.gate_month,
                "gate_from_day": config.gate_from_day,
                "trigger": {"drift_window": config.drift_window, "drift_event": config.drift_event},
                "params": training.params,
                "best_iteration": model.best_iteration,
                "feature_code_version": FEATURE_CODE_VERSION,
                "run_id": run_id,
            },
        )
        reg.set_alias(MODEL_NAME, "challenger", model.sha256, f"trained on drift in {config.drift_window}")
        version = reg.version(MODEL_NAME, model.sha256)
    context.log.info(f"challenger v{version} fitted on {', '.join(config.train_months)} ({features.height} rows)")
    return dg.Output(
        pl.DataFrame({"model": [MODEL_NAME], "sha256": [model.sha256], "version": [version]}),
        metadata={
            "sha256": model.sha256,
            "version": version,
            "fitted_on": ", ".join(training.train_months),
            "early_stopped_on": f"{training.valid_month} days 1–{config.gate_from_day - 1}",
            "gate_month": config.gate_month,
            "drift_window": config.drift_window or dg.MetadataValue.null(),
            "best_iteration": model.best_iteration,
            "train_rows": features.height,
        },
    )


@dg.asset(
    key=CHALLENGER_EVALUATION,
    group_name=LOOP_GROUP,
    kinds={"lightgbm"},
    ins={"model": dg.AssetIn(CHALLENGER_MODEL)},
    tags={"keel/backfill": "skip"},
    check_specs=[
        dg.AssetCheckSpec(
            CHALLENGER_GATE,
            asset=CHALLENGER_EVALUATION,
            description=f"The challenger beats the champion on the gate month's labelled flights: mean per-flight "
            f"log-loss lower by more than {DEFAULT_GATE.margin}, with a one-sided {1 - DEFAULT_GATE.alpha:.0%} "
            "paired-bootstrap bound. Only a passing challenger goes to a canary.",
        )
    ],
    description="Challenger against champion on the newest labelled days neither trained on (the gate month from "
    "gate_from_day on; keel.loop.gate): "
    "log-loss of each, their paired difference with its bootstrap bound, AUC of each. The canary sensor starts a "
    "canary for a challenger that passes.",
)
def challenger_evaluation(
    context: dg.AssetExecutionContext,
    config: ChallengerConfig,
    registry: ModelRegistryResource,
    keel_home: KeelHomeResource,
    model: pl.DataFrame,
):
    sha, version = model["sha256"][0], int(model["version"][0])
    gate_frame = gate_flights(read_months(keel_home.layout(), [config.gate_month]), config)
    with registry.open() as reg:
        champion = reg.alias(MODEL_NAME, "champion")
        if champion is None:
            raise dg.Failure("no champion to compare with: train and promote the first model (keel_models) first")
        if champion == sha:
            raise dg.Failure(f"the challenger is the champion already (v{version}): nothing to compare")
        champion_version = reg.version(MODEL_NAME, champion)
        champion_scores, labels = predict(reg.load(champion), gate_frame)
        challenger_scores, _ = predict(reg.load(sha), gate_frame)
    verdict = challenger_gate(labels, champion_scores, challenger_scores, task=FLIGHTS.task)
    with registry.open() as reg:
        reg.annotate(
            MODEL_NAME,
            sha,
            {
                "challenger_gate": {
                    **verdict.as_metadata(),
                    "gate_month": config.gate_month,
                    "champion_version": champion_version,
                    "run_id": run_id_of(context),
                }
            },
        )
    context.log.info(
        f"challenger v{version} vs champion v{champion_version} on {config.gate_month}: {verdict.reason}"
    )
    numbers = {
        k: dg.MetadataValue.float(round(v, 5)) if v is not None else dg.MetadataValue.null()
        for k, v in verdict.as_metadata().items()
        if k not in ("passed", "reason", "rows", "loss")
    }
    yield dg.Output(
        pl.DataFrame(
            {
                "challenger_version": [version],
                "champion_version": [champion_version],
                "gate_month": [config.gate_month],
                "passed": [verdict.passed],
            }
        ),
        metadata={
            "passed": verdict.passed,
            "reason": verdict.reason,
            "challenger_version": version,
            "champion_version": champion_version,
            "challenger_sha256": sha,
            "gate_month": config.gate_month,
            "gate_days": f"{config.gate_from_day}–end",
            "drift_window": config.drift_window or dg.MetadataValue.null(),
            "drift_event": config.drift_event,
            "rows": verdict.rows,
            "loss": verdict.loss,
            **numbers,
        },
    )
    yield dg.AssetCheckResult(
        asset_key=CHALLENGER_EVALUATION,
        check_name=CHALLENGER_GATE,
        passed=verdict.passed,
        # A challenger that is not better is the loop working, not a fault: the champion stays.
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"reason": verdict.reason, "challenger_version": version, "champion_version": champion_version},
    )


LOOP_REPORT = key("loop_report")
REPORT_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("model", "string", description="served (what the ledger says served each day), static, naive"),
        dg.TableColumn("auc", "float"),
        dg.TableColumn("log_loss", "float"),
    ]
)
ACTIONS_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("simulated", "string", description="simulated time of the decision"),
        dg.TableColumn("wall", "string", description="wall time the run was created (UTC)"),
        dg.TableColumn("action", "string"),
        dg.TableColumn("detail", "string"),
        dg.TableColumn("status", "string"),
    ]
)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _loop_actions(instance: dg.DagsterInstance, month: str) -> list[dict]:
    """The loop's runs whose simulated time falls in ``month``: challengers trained, canary decisions deployed."""
    out = []
    for run in instance.get_runs(limit=5000):
        sim = run.tags.get("keel/sim_now", "")
        if not sim.startswith(month):
            continue
        if run.job_name == "keel_challenger":
            action, detail = "challenger", f"plan {run.tags.get('keel/plan')} ({run.tags.get('keel/reason', '')})"
        elif "keel/canary_action" in run.tags:
            action = f"canary {run.tags['keel/canary_action']}"
            detail = f"{run.tags.get('keel/canary')} at {run.tags.get('keel/canary_percent')} %"
        else:
            continue
        wall = instance.get_run_record_by_id(run.run_id).create_timestamp
        out.append(
            {
                "simulated": sim,
                "wall": wall.astimezone(UTC).isoformat(timespec="seconds"),
                "action": action,
                "detail": detail,
                "status": run.status.value,
            }
        )
    return sorted(out, key=lambda a: a["simulated"])


@dg.asset(
    key=LOOP_REPORT,
    partitions_def=monthly_2013,
    group_name=LOOP_GROUP,
    kinds={"lightgbm", "polars"},
    ins={"features": dg.AssetIn(FLIGHT_FEATURES)},
    deps=[DRIFT_REPORT, MODEL_DEPLOYMENT, CHALLENGER_EVALUATION],
    description="The year, measured: on the month's realized labels, the AUC and log-loss of what was served (the "
    "model of the release live each day, from the ledger), of the static January–March model and of a naive "
    "baseline retrained every month without a gate; and the loop's actions in the month with their simulated and "
    "wall times. The Plots tab shows the series across months. Built with each month's drift report.",
)
def loop_report(
    context: dg.AssetExecutionContext,
    features: pl.DataFrame,
    registry: ModelRegistryResource,
    ledger: LedgerResource,
    keel_home: KeelHomeResource,
) -> dg.Output[pl.DataFrame]:
    month = context.partition_key
    with ledger.open() as led:
        entries = led.log()
    releases = [
        Release(e.live_from, e.release_id, e.manifest["model"]["parts"]["sha256"])
        for e in entries
        if e.manifest.get("model", {}).get("parts", {}).get("sha256")
    ]
    if not releases:
        raise dg.Failure("the ledger has no release: nothing has served yet (keel_models deploys the first model)")
    naive_text, naive_note = None, "the year does not go back three months"
    window = naive_window(month)
    if window is not None:
        fit, valid = window
        try:
            frames = read_months(keel_home.layout(), [*fit, valid])
            naive_text = train_model(frames, TrainingConfig(train_months=fit, valid_month=valid)).text
            naive_note = f"fitted on {', '.join(fit)}, early-stopped on {valid}"
        except dg.Failure as exc:
            naive_note = str(exc)
    with registry.open() as reg:
        report = month_report(month, features, releases, reg.load, reg.load(releases[0].model_sha), naive_text)
        versions = {sha: reg.version(MODEL_NAME, sha) for sha in report.served_by}
    actions = _loop_actions(context.instance, month)
    rows = [("served", report.served), ("static", report.static), ("naive", report.naive)]
    frame = pl.DataFrame(
        {
            "month": [month] * 3,
            "model": [r[0] for r in rows],
            "auc": [r[1].auc for r in rows],
            "log_loss": [r[1].log_loss for r in rows],
        },
        schema={"month": pl.String, "model": pl.String, "auc": pl.Float64, "log_loss": pl.Float64},
    )

    def num(x: float | None) -> dg.MetadataValue:
        return dg.MetadataValue.float(_round(x)) if x is not None else dg.MetadataValue.null()

    return dg.Output(
        frame,
        metadata={
            "served_auc": num(report.served.auc),
            "static_auc": num(report.static.auc),
            "naive_auc": num(report.naive.auc),
            "served_log_loss": num(report.served.log_loss),
            "static_log_loss": num(report.static.log_loss),
            "naive_log_loss": num(report.naive.log_loss),
            "served_minus_static_auc": num(
                report.served.auc - report.static.auc
                if report.served.auc is not None and report.static.auc is not None
                else None
            ),
            "labelled_flights": report.rows,
            "served_by": ", ".join(f"v{versions[s]}: {n:,} flights" for s, n in report.served_by.items()) or "none",
            "naive": naive_note,
            "scores": dg.MetadataValue.table(
                records=[
                    dg.TableRecord({"model": n, "auc": _round(sc.auc), "log_loss": _round(sc.log_loss)})
                    for n, sc in rows
                ],
                schema=REPORT_SCHEMA,
            ),
            "actions": dg.MetadataValue.table(records=[dg.TableRecord(a) for a in actions], schema=ACTIONS_SCHEMA),
            "action_count": len(actions),
        },
    )


loop_assets = [challenger_model, challenger_evaluation, loop_report]
