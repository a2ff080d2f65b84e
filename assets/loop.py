"""The loop's assets: what a drift report leads to — a challenger trained on the most recent labelled months, and its
gate against the champion on the newest labelled month neither trained on.

    drift_report ─► challenger_model ─► challenger_evaluation (check: challenger_gate) ─► canary (policy store)
                                                                                          ─► model_deployment

The drift sensor decides *whether* and *on which months* (keel.loop.retrain.plan_retrain) and launches
``keel_challenger`` with those months as run config; these assets do the work and record it; the canary sensor
starts a canary for a challenger whose gate passed (keel.loop.gate.challenger_gate). Both read the months' feature
files as the pipeline stored them, so a window is any months that exist, not a partition mapping fixed in code.
"""

import dagster as dg
import polars as pl

from assets.drift import DRIFT_REPORT
from assets.features import FEATURE_CODE_VERSION, FLIGHT_FEATURES
from assets.models import MODEL_NAME, run_id_of
from keel.home import KeelHome
from keel.loop.gate import DEFAULT_GATE, challenger_gate
from keel.training.model import TrainingConfig, predict, train_model
from resources.home import KeelHomeResource
from resources.registry import ModelRegistryResource

LOOP_GROUP = "loop"
CHALLENGER_MODEL = dg.AssetKey("challenger_model")
CHALLENGER_EVALUATION = dg.AssetKey("challenger_evaluation")
CHALLENGER_GATE = "challenger_gate"


class ChallengerConfig(dg.Config):
    """What the drift sensor's plan says (keel.loop.retrain.RetrainPlan): the data window (fitted on all but its
    last month, early-stopped on that one), the month that judges it, and the drift that asked for it."""

    train_months: list[str]
    gate_month: str
    drift_window: str = ""
    drift_event: int = 0


def read_months(home: KeelHome, months: list[str]) -> pl.DataFrame:
    """The stored flight_features partitions of ``months``; a missing one is an error that names it."""
    paths = [home.asset_file(FLIGHT_FEATURES.to_user_string(), m) for m in months]
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
    "the most recent labelled months but the newest, fitted on all but the last and early-stopped on it). "
    "Registered in the registry with its window and the drift report that asked for it. Launched by the drift "
    "sensor in a live replay (`keel_challenger`), or from the Launchpad with the months as config.",
)
def challenger_model(
    context: dg.AssetExecutionContext,
    config: ChallengerConfig,
    registry: ModelRegistryResource,
    keel_home: KeelHomeResource,
) -> dg.Output[pl.DataFrame]:
    if len(config.train_months) < 2:
        raise dg.Failure(f"train_months {config.train_months}: needs at least two months (fit, then early-stop)")
    if config.gate_month in config.train_months:
        raise dg.Failure(f"gate month {config.gate_month} is in the training window: the gate would not be fair")
    training = TrainingConfig(train_months=tuple(config.train_months[:-1]), valid_month=config.train_months[-1])
    features = read_months(keel_home.layout(), config.train_months)
    model = train_model(features, training)
    run_id = run_id_of(context)
    with registry.open() as reg:
        reg.register(
            MODEL_NAME,
            model.text,
            {
                "train_months": list(training.train_months),
                "valid_month": training.valid_month,
                "gate_month": config.gate_month,
                "trigger": {"drift_window": config.drift_window, "drift_event": config.drift_event},
                "params": training.params,
                "best_iteration": model.best_iteration,
                "feature_code_version": FEATURE_CODE_VERSION,
                "run_id": run_id,
            },
        )
        reg.set_alias(MODEL_NAME, "challenger", model.sha256, f"trained on drift in {config.drift_window}")
        version = reg.version(MODEL_NAME, model.sha256)
    context.log.info(f"challenger v{version} trained on {', '.join(config.train_months)} ({features.height} rows)")
    return dg.Output(
        pl.DataFrame({"model": [MODEL_NAME], "sha256": [model.sha256], "version": [version]}),
        metadata={
            "sha256": model.sha256,
            "version": version,
            "fitted_on": ", ".join(training.train_months),
            "early_stopped_on": training.valid_month,
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
    description="Challenger against champion on the newest labelled month neither trained on (keel.loop.gate): "
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
    gate_frame = read_months(keel_home.layout(), [config.gate_month])
    with registry.open() as reg:
        champion = reg.alias(MODEL_NAME, "champion")
        if champion is None:
            raise dg.Failure("no champion to compare with: train and promote the first model (keel_models) first")
        if champion == sha:
            raise dg.Failure(f"the challenger is the champion already (v{version}): nothing to compare")
        champion_version = reg.version(MODEL_NAME, champion)
        champion_scores, labels = predict(reg.load(champion), gate_frame)
        challenger_scores, _ = predict(reg.load(sha), gate_frame)
    verdict = challenger_gate(labels, champion_scores, challenger_scores)
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
        if k not in ("passed", "reason", "rows")
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
            "drift_window": config.drift_window or dg.MetadataValue.null(),
            "drift_event": config.drift_event,
            "rows": verdict.rows,
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


loop_assets = [challenger_model, challenger_evaluation]
