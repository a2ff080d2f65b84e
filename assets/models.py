"""A use case's model: trained on a window of feature partitions, early-stopped on the month after it, evaluated
against the champion by the label's task (AUC, log-loss, calibration for binary; RMSE, MAE for regression), gated,
and promoted in the registry.

The window is the declaration's (``ModelSpec.train_months``, ``valid_month``; keel/usecase.py): for flights, trained
on 2013-01…02, early-stopped on 2013-03 and judged by the quality gate on 2013-03 too — no later month exists when
the first model is trained (docs/live.md). Later models are challengers the loop trains on rolling windows
(assets/loop.py).

Another window is one call: ``build_model_assets(uc, config=TrainingConfig(train_months=(...), valid_month=...))``.
"""

import dataclasses
import hashlib
import json
from functools import cache
from pathlib import Path

import dagster as dg
import polars as pl
from dagster._core.errors import DagsterInvalidPropertyError

import keel.training.coarse as coarse_module
import keel.training.model as training_module
from assets.features import feature_code_version
from assets.usecase import wiring
from keel.contracts.spec import load_contract
from keel.factories.markdown import frame_to_markdown
from keel.loop.estimate import estimator_record
from keel.registry import QUALITY_GATE_KEY
from keel.release import infra_snapshot, release_manifest
from keel.training.coarse import coarse_metadata, fit_coarse
from keel.training.model import (
    DEFAULT_PARAMS,
    GatePolicy,
    TrainingConfig,
    evaluate,
    interval_record,
    month_of,
    quality_gate,
    train_model,
    training_rows,
    valid_rows_named,
)
from keel.usecase import Coarse, UseCase
from resources import simulated
from resources.registry import ModelRegistryResource

GATE_CHECK = "quality_gate"
GATE = GatePolicy()  # read when the gate runs (tests loosen it)


def training_config(uc: UseCase) -> TrainingConfig:
    """The first model's training config, from the declaration: its window and LightGBM parameters over keel's
    deterministic defaults."""
    spec = uc.model
    if not spec.train_months or spec.valid_month is None:
        raise ValueError(f"use case {uc.name}: its model declares no train_months / valid_month")
    return TrainingConfig(
        train_months=spec.train_months, valid_month=spec.valid_month, params={**DEFAULT_PARAMS, **spec.params}
    )


def trained_contracts(uc: UseCase) -> tuple[Path, ...]:
    """The contracts the training data passed: those of the use case's validated tables."""
    return tuple(
        uc.contract_path(src.name) for src in uc.sources if src.partitioned and uc.contract_path(src.name).is_file()
    )


def contract_hashes(paths: tuple[Path, ...]) -> dict[str, str]:
    """The sha256 of each contract the training data passed (``trained_contracts``), by contract name."""
    return {spec.name: spec.content_hash for spec in (load_contract(p) for p in paths)}


def training_code_version(
    contracts: dict[str, str], config: TrainingConfig, feature_code: str, coarse: Coarse | None = None
) -> str:
    """The model's code version: training code, config (window, rounds, params), the coarse model's declaration,
    feature code and the contracts its data passed — editing any of them (a contract included) marks the model
    stale in the UI."""
    return hashlib.sha256(
        Path(training_module.__file__).read_bytes()
        + Path(coarse_module.__file__).read_bytes()
        + json.dumps(dataclasses.asdict(config), sort_keys=True).encode()
        + json.dumps(dataclasses.asdict(coarse) if coarse else None).encode()
        + feature_code.encode()
        + json.dumps(contracts, sort_keys=True).encode()
    ).hexdigest()[:16]


def build_model_assets(
    uc: UseCase, contract_paths: tuple[Path, ...] | None = None, config: TrainingConfig | None = None
) -> list[dg.AssetsDefinition]:
    """<model asset> → model_evaluation (blocking quality gate) → model_promotion: trained on ``config``'s window
    (default: the declaration's) of the use case's feature partitions and versioned by it and by the contracts at
    ``contract_paths`` (default: the use case's)."""
    w = wiring(uc)
    fs = uc.features
    task = fs.label.task
    config = config or training_config(uc)
    model_name = uc.model.name
    table_key = w.key(uc.feature_table)
    model_key, evaluation_key = w.key(uc.model.asset), w.key("model_evaluation")
    holdout_month = config.valid_month
    feature_code = feature_code_version(uc)
    contracts = contract_hashes(contract_paths or trained_contracts(uc))
    code_version = training_code_version(contracts, config, feature_code, uc.model.coarse)
    window = f"{config.train_months[0]}…{config.train_months[-1]}"
    label = fs.label.column + (f" ({fs.label.description})" if fs.label.description else "")

    @dg.asset(
        key=model_key,
        group_name=w.group("models"),
        kinds={"lightgbm", "model"},
        code_version=code_version,
        ins={
            "features": dg.AssetIn(
                table_key,
                partition_mapping=dg.SpecificPartitionsPartitionMapping([*config.train_months, config.valid_month]),
            )
        },
        description=f"LightGBM {task} model of {label}, trained on {window} and early-stopped on {config.valid_month}; "
        "deterministic (same data, config and seed → byte-identical model). Registered as challenger.",
    )
    def model_asset(
        context: dg.AssetExecutionContext, registry: ModelRegistryResource, features: pl.DataFrame
    ) -> dg.Output[pl.DataFrame]:
        model = train_model(features, config, fs)
        with registry.open() as reg:
            reg.register(
                model_name,
                model.text,
                {
                    "train_months": list(config.train_months),
                    "valid_month": config.valid_month,
                    "data_versions": {
                        table_key.to_user_string(): _data_versions(
                            context, table_key, [*config.train_months, config.valid_month]
                        )
                    },
                    "contracts": contracts,
                    "params": config.params,
                    "best_iteration": model.best_iteration,
                    "feature_code_version": feature_code,
                    "training_code_version": code_version,
                    "run_id": run_id_of(context),
                    **interval_record(
                        model.text,
                        training_rows(features, config, fs)[1],
                        fs,
                        uc.model.interval_coverage,
                        valid_rows_named(config),
                    ),
                    **estimator_record(
                        model.text, training_rows(features, config, fs)[1], fs, valid_rows_named(config)
                    ),
                },
            )
            coarse = fit_coarse(reg, model_name, uc.model.coarse, features, config, fs, model.sha256,
                                {"train_months": list(config.train_months), "run_id": run_id_of(context)},
                                uc.model.interval_coverage)  # fmt: skip
        record = pl.DataFrame(
            {"model": [model_name], "sha256": [model.sha256], "best_iteration": [model.best_iteration]}
        )
        return dg.Output(
            record,
            metadata={
                "sha256": model.sha256,
                "best_iteration": model.best_iteration,
                "train_rows": features.height,
                **coarse_metadata(coarse),
            },  # fmt: skip
        )

    @dg.asset(
        key=evaluation_key,
        group_name=w.group("models"),
        kinds={"lightgbm"},
        code_version=code_version,
        ins={
            "model": dg.AssetIn(model_key),
            "holdout": dg.AssetIn(
                table_key, partition_mapping=dg.SpecificPartitionsPartitionMapping([holdout_month])
            ),
        },
        check_specs=[
            dg.AssetCheckSpec(
                GATE_CHECK,
                asset=evaluation_key,
                blocking=True,
                description=GATE.describe(task),
            )
        ],
        description=f"The candidate (and the champion, when there is one) on the {holdout_month} holdout: "
        + ("AUC, log-loss, Brier, ECE" if task == "binary" else "RMSE, MAE")
        + (f", per {' and '.join(uc.segments)}" if uc.segments else "")
        + ", feature importance. Its blocking quality gate stops promotion.",
    )
    def model_evaluation(
        context: dg.AssetExecutionContext, registry: ModelRegistryResource, model: pl.DataFrame, holdout: pl.DataFrame
    ):
        sha = model["sha256"][0]
        holdout = month_of(holdout, holdout_month, fs)
        with registry.open() as reg:
            candidate = evaluate(reg.load(sha), holdout, uc.segments, fs=fs)
            champion_sha = reg.alias(model_name, "champion")
            champion = (
                evaluate(reg.load(champion_sha), holdout, (), fs=fs).as_metrics()
                if champion_sha and champion_sha != sha
                else None
            )
        decision = quality_gate(candidate.as_metrics(), champion, GATE, task)
        with registry.open() as reg:
            reg.annotate(
                model_name,
                sha,
                {
                    "metrics": {"holdout_month": holdout_month, **candidate.as_metrics()},
                    "evaluation_run_id": run_id_of(context),
                    QUALITY_GATE_KEY: {"passed": decision.passed, "reasons": list(decision.reasons)},
                },
            )
            if decision.passed:  # only a vetted model is the challenger (keel.registry.passed_a_gate)
                reg.set_alias(model_name, "challenger", sha, f"quality gate passed in run {run_id_of(context)}")
        table = pl.DataFrame(
            {
                "model": [model_name],
                "sha256": [sha],
                "gate_passed": [decision.passed],
                **{k: [v] for k, v in candidate.as_metrics().items()},
            }
        )
        importance = pl.DataFrame(
            {"feature": list(candidate.importance), "gain_share": list(candidate.importance.values())}
        ).sort("gain_share", descending=True)
        segments = pl.DataFrame(
            [{"dimension": d, "segment": s, **m} for d, segs in candidate.segments.items() for s, m in segs.items()]
        )
        yield dg.Output(
            table,
            metadata={
                **{k: dg.MetadataValue.float(round(v, 4)) for k, v in candidate.as_metrics().items()},
                "holdout_rows": candidate.rows,
                "champion": dg.MetadataValue.json(champion or {}),
                "importance": dg.MetadataValue.md(
                    frame_to_markdown(importance.with_columns(pl.col("gain_share").round(4)), max_rows=20)
                ),
                "segments": dg.MetadataValue.md(
                    frame_to_markdown(
                        segments.with_columns(pl.col(m).round(4) for m in uc.metrics if m in segments.columns),
                        max_rows=30,
                    )
                ),
            },
        )
        yield dg.AssetCheckResult(
            asset_key=evaluation_key,
            check_name=GATE_CHECK,
            passed=decision.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={
                "reasons": "; ".join(decision.reasons),
                **{
                    f"{who}_{m}": dg.MetadataValue.float(round(metrics[m], 4))
                    if metrics and metrics.get(m) is not None
                    else dg.MetadataValue.null()
                    for who, metrics in (("candidate", candidate.as_metrics()), ("champion", champion))
                    for m in uc.metrics[:1]
                },
            },
        )

    @dg.asset(
        key=w.key("model_promotion"),
        group_name=w.group("models"),
        kinds={"lightgbm"},
        ins={"evaluation": dg.AssetIn(evaluation_key)},
        description="Promotes the candidate to champion in the registry once its quality gate passed (the gate is "
        "blocking: a failed gate stops this asset; the previous champion becomes archived) and builds the candidate "
        "release manifest (data, model, infra, policy hashes); model_deployment puts it live and into the ledger.",
    )
    def model_promotion(
        context: dg.AssetExecutionContext,
        registry: ModelRegistryResource,
        evaluation: pl.DataFrame,
    ) -> dg.MaterializeResult:
        sha = evaluation["sha256"][0]
        with registry.open() as reg:
            reg.promote(model_name, sha, f"quality gate passed in run {run_id_of(context)}")
        manifest = release_manifest(
            data={
                table_key.to_user_string(): _data_versions(
                    context, table_key, [*config.train_months, config.valid_month]
                ),
                "contracts": contracts,
            },
            model={
                "sha256": sha,
                "asset": model_key.to_user_string(),
                "training_code": code_version,
                "feature_code": feature_code,
                "params": config.params,
            },
            infra=infra_snapshot(),
            policy={"routing": None, "canary": None, "circuit_breaker": None},  # set when deployed
        )
        return dg.MaterializeResult(
            metadata={
                **simulated.of_run(context),
                "champion": sha,
                # Not yet a release: model_deployment completes the manifest (the Triton server's version, the
                # policies in force) and records the release id that goes live.
                "candidate_release_id": manifest["release_id"],
                "candidate_manifest": dg.MetadataValue.json(manifest),
            }
        )

    return [model_asset, model_evaluation, model_promotion]


def run_id_of(context: dg.AssetExecutionContext) -> str:
    """The Dagster run id; "direct-invocation" when the asset is called as a function (tests, benchmarks)."""
    try:
        return context.run.run_id
    except DagsterInvalidPropertyError:
        return "direct-invocation"


def _data_versions(
    context: dg.AssetExecutionContext, table: dg.AssetKey, partitions: list[str]
) -> dict[str, str | None]:
    out = {}
    for partition in partitions:
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=table, asset_partitions=[partition]), limit=1
        ).records
        out[partition] = records[0].asset_materialization.tags.get("dagster/data_version") if records else None
    return out


@cache
def model_assets_of(uc: UseCase) -> list[dg.AssetsDefinition]:
    """The use case's model assets with the declaration's window and contracts (what definitions.py serves)."""
    return build_model_assets(uc)


# The flights use case's model assets, by name (the wiring still its own imports them).
