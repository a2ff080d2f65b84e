"""Drift of a use case's features: a reference profile of what its first model was trained on and a monthly drift
report with a check per monitored column (what is monitored: the declaration's ``monitoring``, keel/usecase.py)."""

import math
from functools import cache

import dagster as dg
import polars as pl

from assets.features import build_feature_assets, feature_code_version
from assets.partitions import monthly_cadence
from assets.usecase import wiring
from keel.clock import SimClock
from keel.drift import DriftConfig, DriftReport, ReferenceProfile, build_reference, compare
from keel.drift.plot import drift_svg_markdown
from keel.factories.checks import partitioned_check
from keel.home import asset_file
from keel.loop.freeze import FreezeDecision, freeze_evidence
from keel.loop.reference import reference_window, window_label
from keel.metrics import LOSS_NAMES
from keel.usecase import UseCase
from resources.home import KeelHomeResource
from resources.pools import MemoryPoolsResource
from resources.registry import ModelRegistryResource


def drift_check_name(feature: str) -> str:
    return f"drift_{feature}"


def _num(value: float | None, digits: int = 4) -> float | None:
    """A rounded finite number, or None (an explicit null in the UI, never NaN)."""
    return None if value is None or not math.isfinite(value) else round(value, digits)


def features_schema(loss: str = "log_loss") -> dg.TableSchema:
    """The per-feature table's columns; the freeze evidence's loss columns named for the model's task (``loss``:
    keel.metrics.LOSS_NAMES — log_loss for a binary label, squared_error for a regression)."""
    words = loss.replace("_", "-")
    return dg.TableSchema(
        columns=[
            dg.TableColumn("feature", "string"),
            dg.TableColumn("drifted", "bool"),
            dg.TableColumn("severity", "string", description="none | warn | error"),
            dg.TableColumn("metric", "string", description="the statistic the verdict uses"),
            dg.TableColumn("value", "float"),
            dg.TableColumn("threshold", "float"),
            dg.TableColumn("ratio", "float", description="value ÷ threshold: drifted above 1 (the chart's bars)"),
            dg.TableColumn("psi", "float"),
            dg.TableColumn("ks_pvalue", "float"),
            dg.TableColumn("reference_mean", "float", description="the value a frozen feature is served with"),
            dg.TableColumn("status", "string", description="ok | drift | no_data | missing"),
            dg.TableColumn(
                "freeze",
                "bool",
                description="the evidence's verdict for a drifted served feature: does the serving model score better on "
                "this month's labelled rows with it frozen? (null: not drifted, not served, or no model yet)",
            ),
            dg.TableColumn(f"live_{loss}", "float", description=f"the serving model's {words}, the feature as it is"),
            dg.TableColumn(f"frozen_{loss}", "float", description="… and with it frozen at reference_mean"),
            dg.TableColumn(
                "freeze_expires", "string", description="when a freeze on this evidence ends (simulated time)"
            ),
            dg.TableColumn("freeze_reason", "string"),
        ]
    )


def report_metadata(
    report: DriftReport, evidence: dict[str, FreezeDecision] | None = None, loss: str = "log_loss"
) -> dict:
    """What the UI shows of a report: the verdict, numbers Dagster plots across partitions, a per-feature table
    (the drift sensor reads it too, with the freeze evidence of each drifted served feature) and the chart."""
    evidence = evidence or {}
    records = []
    for f in report.features:
        e = evidence.get(f.feature)
        ratio = f.value / f.threshold if f.value is not None and f.threshold else None
        records.append(
            dg.TableRecord(
                {
                    "feature": f.feature,
                    "drifted": f.drifted,
                    "severity": f.severity,
                    "metric": f.metric,
                    "value": _num(f.value),
                    "threshold": _num(f.threshold),
                    "ratio": _num(ratio, 3),
                    "psi": _num(f.psi),
                    "ks_pvalue": _num(f.ks_pvalue, 6),
                    "reference_mean": _num(f.reference_mean, 6),
                    "status": f.status,
                    "freeze": e.freeze if e else None,
                    f"live_{loss}": _num(e.live_log_loss, 5) if e and e.live_log_loss is not None else None,
                    f"frozen_{loss}": _num(e.frozen_log_loss, 5) if e and e.frozen_log_loss is not None else None,
                    "freeze_expires": e.expires_at.isoformat(timespec="seconds") if e and e.expires_at else None,
                    "freeze_reason": e.reason if e else None,
                }
            )
        )
    share = report.drifted_share
    return {
        "verdict": report.verdict,
        "drifted_share": dg.MetadataValue.float(round(share, 4)) if share is not None else dg.MetadataValue.null(),
        "drifted_count": len(report.drifted_features),
        "drifted_features": ", ".join(report.drifted_features) or "none",
        "features": dg.MetadataValue.table(records=records, schema=features_schema(loss)),
        "plot": dg.MetadataValue.md(drift_svg_markdown(report)),
    }


@cache
def build_drift_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """The use case's ``drift_reference`` (its first model's months, once) and monthly ``drift_report``, in its
    ``drift`` group; the report's arrays live in the model's memory pool."""
    w = wiring(uc)
    features_key = build_feature_assets(uc)[0].key  # the feature table
    reference_key, report_key = w.key("drift_reference"), w.key("drift_report")
    months = list(uc.monitoring.reference_months)
    window = window_label(tuple(months))
    numeric, categorical = uc.monitored
    config = DriftConfig(thresholds=dict(uc.monitoring.thresholds))
    model = uc.model.name

    @dg.asset(
        key=reference_key,
        group_name=w.group("drift"),
        kinds={"numpy", "parquet"},
        code_version=feature_code_version(uc),
        ins={"features": dg.AssetIn(features_key, partition_mapping=dg.SpecificPartitionsPartitionMapping(months))},
        description=f"Reference statistics of the {uc.name} features over {window}, computed once: sorted sketches "
        "of numeric features, category counts. Every drift report compares against it.",
    )
    def drift_reference(features: pl.DataFrame) -> dg.Output[pl.DataFrame]:
        profile = build_reference(features, window=window, numeric=numeric, categorical=categorical)
        return dg.Output(
            profile.to_frame(),
            metadata={"rows": features.height, "features": len(profile.features), "window": profile.window},
        )

    @dg.asset(
        key=report_key,
        partitions_def=w.monthly,
        freshness_policy=monthly_cadence(),
        group_name=w.group("drift"),
        kinds={"numpy", "parquet"},
        code_version=feature_code_version(uc),
        ins={"features": dg.AssetIn(features_key), "reference": dg.AssetIn(reference_key)},
        check_specs=[
            partitioned_check(
                drift_check_name(f),
                asset=report_key,
                partitions_def=w.monthly,
                description=f"{f} has not drifted from what the serving model was trained on",
            )
            for f in numeric + categorical
        ],
        description="Per feature: normalised Wasserstein, KS, PSI, KL (numeric); Jensen-Shannon, chi-square, PSI, "
        "unseen categories (categorical) — the month against what the serving model was trained on (the champion's "
        f"training months: {window} until a retrained model is promoted), with a verdict the drift sensor acts on.",
    )
    def drift_report(
        context: dg.AssetExecutionContext,
        features: pl.DataFrame,
        reference: pl.DataFrame,
        memory_pools: MemoryPoolsResource,
        registry: ModelRegistryResource,
        keel_home: KeelHomeResource,
    ):
        pool = memory_pools.pool(model, uc.serving.pool_budget_bytes)
        profile = _serving_reference(uc, reference, registry, keel_home)
        report = compare(profile, features, window=context.partition_key, config=config, pool=pool)
        context.log.info(
            f"drift {context.partition_key}: {report.verdict}; drifted: {', '.join(report.drifted_features) or 'none'}"
        )
        pool_md = {  # the drift kernels' arrays in the model's memory pool: numbers, so they plot across months
            "memory_pool": f"{model} on {'gpu' if pool.on_gpu else 'cpu'}",
            "pool_peak_bytes": pool.peak_bytes(),
            "pool_limit_bytes": pool.limit_bytes,
        }
        evidence = _freeze_evidence(uc, context, report, features, registry, keel_home)
        yield dg.Output(
            report.to_frame(),
            metadata=report_metadata(report, evidence, LOSS_NAMES[uc.task])
            | {"dagster/row_count": len(report.features)}
            | pool_md,
        )
        for f in report.features:
            yield dg.AssetCheckResult(
                asset_key=report_key,
                check_name=drift_check_name(f.feature),
                passed=not f.drifted,
                severity=dg.AssetCheckSeverity.ERROR if f.severity == "error" else dg.AssetCheckSeverity.WARN,
                metadata={
                    "status": f.status,
                    f.metric: dg.MetadataValue.float(_num(f.value))
                    if _num(f.value) is not None
                    else dg.MetadataValue.null(),
                    "threshold": dg.MetadataValue.float(f.threshold),
                },
            )

    return [drift_reference, drift_report]


def _freeze_evidence(
    uc: UseCase,
    context: dg.AssetExecutionContext,
    report: DriftReport,
    features: pl.DataFrame,
    registry: ModelRegistryResource,
    keel_home: KeelHomeResource,
) -> dict[str, FreezeDecision]:
    """For each drifted served feature: would the serving model do better on this month's labelled rows with it
    frozen? (keel.loop.freeze). The drift sensor freezes only on a yes; the answer expires on the shared clock."""
    drifted = [f for f in report.features if f.drifted and f.feature in uc.features.names]
    if not drifted:
        return {}
    with registry.open() as reg:
        champion = reg.alias(uc.model.name, "champion")
        if champion is None:
            context.log.info("no champion yet: drifted features are not judged for freezing")
            return {}
        model_text = reg.load(champion)
    now = SimClock(keel_home.layout().clock, uc.name).now()
    out = {}
    for f in drifted:
        out[f.feature] = freeze_evidence(
            model_text, features, f.feature, f.reference_mean, report.window, now, fs=uc.features
        )
        context.log.info(f"freeze {f.feature}? {out[f.feature].freeze}: {out[f.feature].reason}")
    return out


def _serving_reference(
    uc: UseCase, initial: pl.DataFrame, registry: ModelRegistryResource, keel_home: KeelHomeResource
) -> ReferenceProfile:
    """The reference of what the serving model was trained on (keel.loop.reference): drift_reference while the
    champion is trained on the reference months, else a profile of the champion's own training months."""
    first = uc.monitoring.reference_months
    with registry.open() as reg:
        champion = reg.alias(uc.model.name, "champion")
        metadata = reg.get(uc.model.name, champion).metadata if champion else None
    window = reference_window(metadata, first)
    if window == first:
        return ReferenceProfile.from_frame(initial)
    home = keel_home.layout()
    table = build_feature_assets(uc)[0].key
    paths = [asset_file(home.storage, list(table.path), m) for m in window]
    missing = [p for p, m in zip(paths, window, strict=True) if not p.exists()]
    if missing:
        raise dg.Failure(
            f"the champion was trained on {window_label(window)}, but {table.to_user_string()} has no file for "
            f"{', '.join(str(p.name) for p in missing)}: materialize those months first"
        )
    frames = pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")
    numeric, categorical = uc.monitored
    return build_reference(frames, window=window_label(window), numeric=numeric, categorical=categorical)


# The flights use case's drift assets and names (sensors and jobs still wire them by name).
