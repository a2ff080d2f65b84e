"""The loop's assets: what a drift report leads to — a challenger trained on the most recent labelled months, and its
gate against the champion on the newest labelled month neither trained on.

    drift_report ─► challenger_model ─► challenger_evaluation (check: challenger_gate) ─► canary (policy store)
                                                                                          ─► model_deployment

The drift sensor decides *whether* and *on which months* (keel.loop.retrain.plan_retrain) and launches
``flights_challenger`` with those months as run config; these assets do the work and record it; the canary sensor
starts a canary for a challenger whose gate passed (keel.loop.gate.challenger_gate). Both read the months' feature
files as the pipeline stored them, so a window is any months that exist, not a partition mapping fixed in code.
"""

from dataclasses import replace
from datetime import UTC
from functools import cache

import dagster as dg
import polars as pl

from assets.deployment import build_deployment_assets
from assets.drift import build_drift_assets
from assets.features import build_feature_assets, feature_code_version
from assets.models import run_id_of, training_config
from assets.usecase import wiring
from keel.home import KeelHome, asset_file
from keel.loop.gate import DEFAULT_GATE, challenger_gate
from keel.loop.report import Release, month_report, naive_window
from keel.metrics import LOSS_NAMES
from keel.training.coarse import coarse_metadata, fit_coarse
from keel.training.model import TrainingConfig, month_of, predict, train_model
from keel.usecase import UseCase
from resources.home import KeelHomeResource
from resources.ledger import LedgerResource
from resources.registry import ModelRegistryResource

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


def gate_rows(uc: UseCase, frame: pl.DataFrame, config: ChallengerConfig) -> pl.DataFrame:
    """The rows that judge the challenger: the gate month's days from ``gate_from_day`` on."""
    fs = uc.features
    return month_of(frame, config.gate_month, fs).filter(fs.entity.partition_day.dt.day() >= config.gate_from_day)


def read_months(uc: UseCase, home: KeelHome, months: list[str]) -> pl.DataFrame:
    """The stored partitions of the use case's feature table for ``months``; a missing one is an error naming it."""
    table = build_feature_assets(uc)[0].key
    paths = [asset_file(home.storage, list(table.path), m) for m in months]
    missing = [m for m, p in zip(months, paths, strict=True) if not p.exists()]
    if missing:
        raise dg.Failure(
            f"{table.to_user_string()} has no stored partition for {', '.join(missing)}: materialize it first"
        )
    return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")


@cache
def build_loop_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """The use case's ``challenger_model``, ``challenger_evaluation`` (its gate) and monthly ``loop_report``, in its
    ``loop`` group; judged by the metrics of its label's task."""
    w = wiring(uc)
    fs, name, task = uc.features, uc.model.name, uc.task
    loss = LOSS_NAMES[task].replace("_", "-")
    entity = fs.entity.name
    gate_policy = replace(DEFAULT_GATE, min_rows=uc.loop.gate_min_rows)  # the same gate at the use case's scale
    table = build_feature_assets(uc)[0].key
    drift_report = build_drift_assets(uc)[1].key
    deployment = build_deployment_assets(uc)[0].key
    challenger_key, evaluation_key, report_key = (
        w.key("challenger_model"),
        w.key("challenger_evaluation"),
        w.key("loop_report"),
    )
    metrics = uc.metrics
    first = training_config(uc)

    @dg.asset(
        key=challenger_key,
        group_name=w.group("loop"),
        kinds={"lightgbm"},
        deps=[drift_report],
        tags={"keel/backfill": "skip"},
        description=f"A challenger of the served {name} model, trained when drift asks for one (the drift sensor's "
        "plan: fitted on the three labelled months before the newest, early-stopped on the newest month's first three "
        "weeks). Registered in the registry with its window and the drift report that asked for it. Launched by the "
        "drift sensor in a live replay, or from the Launchpad with the months as config.",
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
            raise dg.Failure(
                f"gate_from_day {config.gate_from_day}: must be 2…28 (early-stop before it, judge from it)"
            )
        training = TrainingConfig(
            train_months=tuple(config.train_months),
            valid_month=config.gate_month,
            valid_days=(1, config.gate_from_day - 1),
            params=first.params,
        )
        features = read_months(uc, keel_home.layout(), [*config.train_months, config.gate_month])
        model = train_model(features, training, fs)
        run_id = run_id_of(context)
        with registry.open() as reg:
            reg.register(
                name,
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
                    "feature_code_version": feature_code_version(uc),
                    "run_id": run_id,
                },
            )
            reg.set_alias(name, "challenger", model.sha256, f"trained on drift in {config.drift_window}")
            version = reg.version(name, model.sha256)
            coarse = fit_coarse(reg, name, uc.model.coarse, features, training, fs, model.sha256,
                                {"train_months": list(training.train_months), "run_id": run_id})  # fmt: skip
        context.log.info(f"challenger v{version} fitted on {', '.join(config.train_months)} ({features.height} rows)")
        return dg.Output(
            pl.DataFrame({"model": [name], "sha256": [model.sha256], "version": [version]}),
            metadata={
                "sha256": model.sha256,
                "version": version,
                "fitted_on": ", ".join(training.train_months),
                "early_stopped_on": f"{training.valid_month} days 1–{config.gate_from_day - 1}",
                "gate_month": config.gate_month,
                "drift_window": config.drift_window or dg.MetadataValue.null(),
                "best_iteration": model.best_iteration,
                "train_rows": features.height,
                **coarse_metadata(coarse),
            },
        )

    @dg.asset(
        key=evaluation_key,
        group_name=w.group("loop"),
        kinds={"lightgbm"},
        ins={"model": dg.AssetIn(challenger_key)},
        tags={"keel/backfill": "skip"},
        check_specs=[
            dg.AssetCheckSpec(
                CHALLENGER_GATE,
                asset=evaluation_key,
                description=f"The challenger beats the champion on the gate month's labelled {entity}s: mean "
                f"per-{entity} {loss} lower by more than {DEFAULT_GATE.margin}, with a one-sided "
                f"{1 - DEFAULT_GATE.alpha:.0%} "
                "paired-bootstrap bound. Only a passing challenger goes to a canary.",
            )
        ],
        description="Challenger against champion on the newest labelled days neither trained on (the gate month from "
        "gate_from_day on; keel.loop.gate): "
        f"{loss} of each, their paired difference with its bootstrap bound, {' and '.join(metrics)} of each. The "
        "canary sensor starts a "
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
        gate_frame = gate_rows(uc, read_months(uc, keel_home.layout(), [config.gate_month]), config)
        with registry.open() as reg:
            champion = reg.alias(name, "champion")
            if champion is None:
                raise dg.Failure(
                    "no champion to compare with: train and promote the first model (flights_models) first"
                )
            if champion == sha:
                raise dg.Failure(f"the challenger is the champion already (v{version}): nothing to compare")
            champion_version = reg.version(name, champion)
            champion_scores, labels = predict(reg.load(champion), gate_frame, fs)
            challenger_scores, _ = predict(reg.load(sha), gate_frame, fs)
        verdict = challenger_gate(labels, champion_scores, challenger_scores, gate_policy, task=task)
        with registry.open() as reg:
            reg.annotate(
                name,
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
            asset_key=evaluation_key,
            check_name=CHALLENGER_GATE,
            passed=verdict.passed,
            # A challenger that is not better is the loop working, not a fault: the champion stays.
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"reason": verdict.reason, "challenger_version": version, "champion_version": champion_version},
        )

    @dg.asset(
        key=report_key,
        partitions_def=w.monthly,
        group_name=w.group("loop"),
        kinds={"lightgbm", "polars"},
        ins={"features": dg.AssetIn(table)},
        deps=[drift_report, deployment, evaluation_key],
        description=f"The year, measured: on the month's realized labels, the {' and '.join(metrics)} of what was "
        f"served (the model of the release live each day, from the ledger), of the static first model "
        f"({', '.join(first.train_months)}) and of a naive "
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
            entries = led.of_line(uc.training_asset)  # this model's releases (the ledger holds every model's)
        releases = [
            Release(e.live_from, e.release_id, e.manifest["model"]["parts"]["sha256"])
            for e in entries
            if e.manifest.get("model", {}).get("parts", {}).get("sha256")
        ]
        if not releases:
            raise dg.Failure("the ledger has no release: nothing has served yet (deploy the first model)")
        naive_text, naive_note = None, "the year does not go back three months"
        window = naive_window(month, months=uc.months)
        if window is not None:
            fit, valid = window
            try:
                frames = read_months(uc, keel_home.layout(), [*fit, valid])
                naive = TrainingConfig(train_months=fit, valid_month=valid, params=first.params)
                naive_text = train_model(frames, naive, fs).text
                naive_note = f"fitted on {', '.join(fit)}, early-stopped on {valid}"
            except dg.Failure as exc:
                naive_note = str(exc)
        with registry.open() as reg:
            static_text = reg.load(releases[0].model_sha)
            report = month_report(month, features, releases, reg.load, static_text, naive_text, fs)
            versions = {sha: reg.version(name, sha) for sha in report.served_by}
        actions = _loop_actions(context.instance, month, challenger_key, name)
        rows = [("served", report.served), ("static", report.static), ("naive", report.naive)]
        frame = pl.DataFrame(
            {"month": [month] * 3, "model": [r[0] for r in rows]}
            | {m: [r[1].metrics[m] for r in rows] for m in metrics},
            schema={"month": pl.String, "model": pl.String} | dict.fromkeys(metrics, pl.Float64),
        )
        head = metrics[0]  # the headline metric: AUC, RMSE
        served, static = report.served.metrics[head], report.static.metrics[head]

        def num(x: float | None) -> dg.MetadataValue:
            return dg.MetadataValue.float(_round(x)) if x is not None else dg.MetadataValue.null()

        return dg.Output(
            frame,
            metadata={
                **{
                    f"{who}_{m}": num(score.metrics[m])
                    for m in metrics
                    for who, score in (("served", report.served), ("static", report.static), ("naive", report.naive))
                },
                f"served_minus_static_{head}": num(
                    served - static if served is not None and static is not None else None
                ),
                f"labelled_{entity}s": report.rows,
                "served_by": ", ".join(f"v{versions[s]}: {n:,} {entity}s" for s, n in report.served_by.items())
                or "none",
                "naive": naive_note,
                "scores": dg.MetadataValue.table(
                    records=[
                        dg.TableRecord({"model": n} | {m: _round(sc.metrics[m]) for m in metrics}) for n, sc in rows
                    ],
                    schema=report_schema(metrics),
                ),
                "actions": dg.MetadataValue.table(
                    records=[dg.TableRecord(a) for a in actions], schema=ACTIONS_SCHEMA
                ),
                "action_count": len(actions),
            },
        )

    return [challenger_model, challenger_evaluation, loop_report]


def report_schema(metrics: tuple[str, ...]) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                "model", "string", description="served (what the ledger says served each day), static, naive"
            ),
            *(dg.TableColumn(m, "float") for m in metrics),
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


def _loop_actions(instance: dg.DagsterInstance, month: str, challenger: dg.AssetKey, model: str) -> list[dict]:
    """The loop's runs whose simulated time falls in ``month``: challengers trained (runs configuring the
    ``challenger`` asset's op), canary decisions deployed (of canaries of ``model``: ``<model>.<tag>-v<version>``)."""
    out = []
    for run in instance.get_runs(limit=5000):
        sim = run.tags.get("keel/sim_now", "")
        if not sim.startswith(month):
            continue
        if challenger.to_python_identifier() in (run.run_config or {}).get("ops", {}):  # its config is required
            action, detail = "challenger", f"plan {run.tags.get('keel/plan')} ({run.tags.get('keel/reason', '')})"
        elif "keel/canary_action" in run.tags and run.tags.get("keel/canary", "").startswith(f"{model}."):
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
