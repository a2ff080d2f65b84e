"""The delay model: trained on a window of feature partitions, early-stopped on the month after it, evaluated against
the champion, gated, and promoted in the registry.

The first model's data is January–March, the history a live year starts from (docs/live.md): trained on 2013-01…02,
early-stopped on 2013-03, and judged by the quality gate on 2013-03 too — no later month exists when it is trained.
Later models are challengers the loop trains on rolling windows (assets/loop.py).

Another window is one call: ``build_model_assets(config=TrainingConfig(train_months=(...), valid_month=...))``.
"""

import dataclasses
import hashlib
import json
from pathlib import Path

import dagster as dg
import polars as pl
from dagster._core.errors import DagsterInvalidPropertyError

import keel.training.model as training_module
from assets.features import FEATURE_CODE_VERSION, FLIGHT_FEATURES
from assets.usecase import group, key
from keel.contracts.catalog import contract_path
from keel.contracts.spec import load_contract
from keel.factories.markdown import frame_to_markdown
from keel.release import infra_snapshot, release_manifest
from keel.training.model import GatePolicy, TrainingConfig, evaluate, month_of, quality_gate, train_model
from resources.registry import ModelRegistryResource

MODELS_GROUP = group("models")
MODEL_NAME = "flight-delay"
DELAY_MODEL = key("delay_model")
MODEL_EVALUATION = key("model_evaluation")
MODEL_PROMOTION = key("model_promotion")
GATE_CHECK = "quality_gate"
CONFIG = TrainingConfig(train_months=("2013-01", "2013-02"), valid_month="2013-03")
HOLDOUT_MONTH = CONFIG.valid_month  # the newest month of the history (see the module's docstring)
GATE = GatePolicy()
CONTRACTS = (contract_path("flights"), contract_path("weather"))


def contract_hashes(paths: tuple[Path, ...] = CONTRACTS) -> dict[str, str]:
    """The sha256 of each contract the training data passed, by contract name."""
    return {spec.name: spec.content_hash for spec in (load_contract(p) for p in paths)}


def training_code_version(contracts: dict[str, str], config: TrainingConfig = CONFIG) -> str:
    """The model's code version: training code, config (window, rounds, params), feature code and the contracts its
    data passed — editing any of them (a contract included) marks the model stale in the UI."""
    return hashlib.sha256(
        Path(training_module.__file__).read_bytes()
        + json.dumps(dataclasses.asdict(config), sort_keys=True).encode()
        + FEATURE_CODE_VERSION.encode()
        + json.dumps(contracts, sort_keys=True).encode()
    ).hexdigest()[:16]


def build_model_assets(
    contract_paths: tuple[Path, ...] = CONTRACTS, config: TrainingConfig = CONFIG
) -> list[dg.AssetsDefinition]:
    """delay_model → model_evaluation (blocking quality gate) → model_promotion: trained on ``config``'s window of
    feature partitions and versioned by it and by the contracts at ``contract_paths``."""
    contracts = contract_hashes(contract_paths)
    code_version = training_code_version(contracts, config)
    window = f"{config.train_months[0]}…{config.train_months[-1]}"

    @dg.asset(
        key=DELAY_MODEL,
        group_name=MODELS_GROUP,
        kinds={"lightgbm", "model"},
        code_version=code_version,
        ins={
            "features": dg.AssetIn(
                FLIGHT_FEATURES,
                partition_mapping=dg.SpecificPartitionsPartitionMapping([*config.train_months, config.valid_month]),
            )
        },
        description=f"LightGBM model of P(arr_delay > 15 min) at scheduling time, trained on {window} and early-stopped "
        f"on {config.valid_month}; deterministic (same data, config and seed → byte-identical model). Registered as challenger.",
    )
    def delay_model(
        context: dg.AssetExecutionContext, registry: ModelRegistryResource, features: pl.DataFrame
    ) -> dg.Output[pl.DataFrame]:
        model = train_model(features, config)
        with registry.open() as reg:
            reg.register(
                MODEL_NAME,
                model.text,
                {
                    "train_months": list(config.train_months),
                    "valid_month": config.valid_month,
                    "data_versions": {
                        FLIGHT_FEATURES.to_user_string(): _data_versions(
                            context, [*config.train_months, config.valid_month]
                        )
                    },
                    "contracts": contracts,
                    "params": config.params,
                    "best_iteration": model.best_iteration,
                    "feature_code_version": FEATURE_CODE_VERSION,
                    "training_code_version": code_version,
                    "run_id": run_id_of(context),
                },
            )
            reg.set_alias(MODEL_NAME, "challenger", model.sha256, f"trained in run {run_id_of(context)}")
        record = pl.DataFrame(
            {"model": [MODEL_NAME], "sha256": [model.sha256], "best_iteration": [model.best_iteration]}
        )
        return dg.Output(
            record,
            metadata={"sha256": model.sha256, "best_iteration": model.best_iteration, "train_rows": features.height},
        )

    @dg.asset(
        key=MODEL_EVALUATION,
        group_name=MODELS_GROUP,
        kinds={"lightgbm"},
        code_version=code_version,
        ins={
            "model": dg.AssetIn(DELAY_MODEL),
            "holdout": dg.AssetIn(
                FLIGHT_FEATURES, partition_mapping=dg.SpecificPartitionsPartitionMapping([HOLDOUT_MONTH])
            ),
        },
        check_specs=[
            dg.AssetCheckSpec(
                GATE_CHECK,
                asset=MODEL_EVALUATION,
                blocking=True,
                description=f"AUC not worse than the champion's by more than {GATE.max_auc_drop}, ECE ≤ {GATE.max_ece}",
            )
        ],
        description=f"The candidate (and the champion, when there is one) on the {HOLDOUT_MONTH} holdout: AUC, log-loss, Brier, "
        "ECE, per carrier and origin, feature importance. Its blocking quality gate stops promotion.",
    )
    def model_evaluation(
        context: dg.AssetExecutionContext, registry: ModelRegistryResource, model: pl.DataFrame, holdout: pl.DataFrame
    ):
        sha = model["sha256"][0]
        holdout = month_of(holdout, HOLDOUT_MONTH)
        with registry.open() as reg:
            candidate = evaluate(reg.load(sha), holdout)
            champion_sha = reg.alias(MODEL_NAME, "champion")
            champion = (
                evaluate(reg.load(champion_sha), holdout).as_metrics()
                if champion_sha and champion_sha != sha
                else None
            )
        decision = quality_gate(candidate.as_metrics(), champion, GATE)
        with registry.open() as reg:
            reg.annotate(
                MODEL_NAME,
                sha,
                {
                    "metrics": {"holdout_month": HOLDOUT_MONTH, **candidate.as_metrics()},
                    "evaluation_run_id": run_id_of(context),
                    "gate": {"passed": decision.passed, "reasons": list(decision.reasons)},
                },
            )
        table = pl.DataFrame(
            {
                "model": [MODEL_NAME],
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
                        segments.with_columns(pl.col("auc").round(4), pl.col("log_loss").round(4)), max_rows=30
                    )
                ),
            },
        )
        yield dg.AssetCheckResult(
            asset_key=MODEL_EVALUATION,
            check_name=GATE_CHECK,
            passed=decision.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={
                "reasons": "; ".join(decision.reasons),
                "candidate_auc": dg.MetadataValue.float(round(candidate.auc, 4)),
                "champion_auc": dg.MetadataValue.float(round(champion["auc"], 4))
                if champion and champion.get("auc") is not None
                else dg.MetadataValue.null(),
            },
        )

    @dg.asset(
        key=MODEL_PROMOTION,
        group_name=MODELS_GROUP,
        kinds={"lightgbm"},
        ins={"evaluation": dg.AssetIn(MODEL_EVALUATION)},
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
            reg.promote(MODEL_NAME, sha, f"quality gate passed in run {run_id_of(context)}")
        manifest = release_manifest(
            data={
                FLIGHT_FEATURES.to_user_string(): _data_versions(context, [*config.train_months, config.valid_month]),
                "contracts": contracts,
            },
            model={
                "sha256": sha,
                "asset": DELAY_MODEL.to_user_string(),
                "training_code": code_version,
                "feature_code": FEATURE_CODE_VERSION,
                "params": config.params,
            },
            infra=infra_snapshot(),
            policy={"routing": None, "canary": None, "circuit_breaker": None},  # set when deployed
        )
        return dg.MaterializeResult(
            metadata={
                "champion": sha,
                # Not yet a release: model_deployment completes the manifest (the Triton server's version, the
                # policies in force) and records the release id that goes live.
                "candidate_release_id": manifest["release_id"],
                "candidate_manifest": dg.MetadataValue.json(manifest),
            }
        )

    return [delay_model, model_evaluation, model_promotion]


def run_id_of(context: dg.AssetExecutionContext) -> str:
    """The Dagster run id; "direct-invocation" when the asset is called as a function (tests, benchmarks)."""
    try:
        return context.run.run_id
    except DagsterInvalidPropertyError:
        return "direct-invocation"


def _data_versions(context: dg.AssetExecutionContext, partitions: list[str]) -> dict[str, str | None]:
    out = {}
    for partition in partitions:
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=FLIGHT_FEATURES, asset_partitions=[partition]), limit=1
        ).records
        out[partition] = records[0].asset_materialization.tags.get("dagster/data_version") if records else None
    return out


model_assets = build_model_assets()
