"""Explanations over time: which features drive the champion's predictions each month, overall and per segment
(mean |TreeSHAP contribution|), against the drift reference window — a sharp change flagged like drift.

Generated per use case (``build_explanation_assets``) and built monthly with the drift report (job
``<use case>_drift``): in the backfill and, in a live replay, once a month's features are complete. The lens is the
champion at the time of the run, applied to the month and to the reference window alike, so a moved share is the
data's doing, not a different model's.
"""

from functools import cache

import dagster as dg
import lightgbm as lgb
import polars as pl

from assets.partitions import monthly_cadence
from assets.usecase import wiring
from keel.explanations import (
    SHIFT_THRESHOLD,
    attribution_shift,
    attribution_summary,
    explanation_sample,
    feature_matrix,
    tree_shap,
)
from keel.factories.checks import partitioned_check
from keel.factories.markdown import frame_to_markdown
from keel.home import asset_file
from keel.plots import stacked_bars_svg, svg_markdown
from keel.usecase import UseCase
from resources.home import KeelHomeResource
from resources.registry import ModelRegistryResource

ATTRIBUTION_SHIFT = "attribution_shift"
TOP = 6  # features shown by name in the plots; the others are summed as "other"
UNITS = {"binary": "log-odds", "regression": "the label's units"}


def top_features(summary: pl.DataFrame, k: int = TOP) -> list[str]:
    """The k features with the largest share overall, largest first."""
    overall = summary.filter(pl.col("segment") == "all").sort("share", descending=True)
    return overall["feature"].head(k).to_list()


def _shares(summary: pl.DataFrame, shown: list[str]) -> dict[str, float]:
    """Overall shares of the ``shown`` features, the rest summed as "other" (the same features in every bar)."""
    overall = summary.filter(pl.col("segment") == "all")
    shares = dict(zip(overall["feature"], overall["share"], strict=True))
    return {f: shares.get(f, 0.0) for f in shown} | {"other": sum(v for f, v in shares.items() if f not in shown)}


def _reference_features(storage, table_key: dg.AssetKey, months: tuple[str, ...]) -> pl.DataFrame:
    """The reference window's feature rows, as the IO manager stored them (the same Parquet files the drift
    reference was built from; a second input on the feature table is not possible in one asset)."""
    paths = [asset_file(storage, list(table_key.path), m) for m in months]
    missing = [m for m, p in zip(months, paths, strict=True) if not p.exists()]
    if missing:
        raise dg.Failure(
            f"{table_key.to_user_string()} of the reference window is missing {', '.join(missing)}: build it first"
        )
    return pl.concat([pl.read_parquet(p) for p in paths], how="vertical_relaxed")


def _earlier_months(storage, key: dg.AssetKey, months, month: str, shown: list[str]) -> dict[str, dict[str, float]]:
    """Overall shares of the months before ``month`` that have been explained (for the trend plot)."""
    out = {}
    for m in months:
        if m >= month:
            break
        path = asset_file(storage, list(key.path), m)
        if path.exists():
            out[m] = _shares(pl.read_parquet(path), shown)
    return out


@cache
def build_explanation_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """``<use case>/explanations``: monthly attribution of the champion's predictions, with its shift check."""
    w = wiring(uc)
    fs, model = uc.features, uc.model.name
    key, table_key = w.key("explanations"), w.key(uc.feature_table)
    reference_months = uc.monitoring.reference_months
    window = f"{reference_months[0]}…{reference_months[-1]}" if reference_months else "none"
    segments = uc.segments
    per = f" — overall and per {' and '.join(segments)}" if segments else ""
    names = fs.names

    @dg.asset(
        key=key,
        partitions_def=w.monthly,
        freshness_policy=monthly_cadence(),
        group_name=w.group("models"),
        kinds={"lightgbm", "parquet"},
        ins={"features": dg.AssetIn(table_key)},
        check_specs=[
            partitioned_check(
                ATTRIBUTION_SHIFT,
                asset=key,
                partitions_def=w.monthly,
                description=f"No feature's share of the champion's attribution moved by more than {SHIFT_THRESHOLD:.0%} "
                f"(absolute) from the reference window {window}: what drives the predictions has not changed sharply",
            )
        ],
        description="Why the model says what it says, month by month: the mean absolute TreeSHAP contribution (exact, "
        f"LightGBM's pred_contrib, {UNITS[uc.task]}) of every feature to the champion's predictions on the month's "
        f"{fs.entity.name} rows (a seeded sample of 5,000){per} — and each feature's share of the total, beside the "
        f"reference window {window} under the same model. Plots: this month against the reference, and the shares "
        "across the months explained so far. Check `attribution_shift` flags a share that moved sharply, like drift.",
    )
    def explanations(
        context: dg.AssetExecutionContext,
        features: pl.DataFrame,
        registry: ModelRegistryResource,
        keel_home: KeelHomeResource,
    ):
        month = context.partition_key
        features = explanation_sample(features, fs, seed=int(month.replace("-", "")))
        reference = explanation_sample(
            _reference_features(keel_home.layout().storage, table_key, reference_months), fs, seed=20130103
        )
        with registry.open() as reg:
            sha = reg.alias(model, "champion")
            if sha is None:
                raise dg.Failure(
                    f"{model} has no champion yet: explanations need a promoted model (job {uc.name}_models)"
                )
            version = reg.version(model, sha)
            booster = lgb.Booster(model_str=reg.load(sha))
        summary = attribution_summary(features, tree_shap(booster, feature_matrix(features, fs)), segments, names)
        if features.height == 0:  # a month without rows (a field study's winter): nothing explained, nothing shifted
            yield dg.Output(summary, metadata={"model_version": version, "model_sha256": sha, "rows_explained": 0})
            yield dg.AssetCheckResult(asset_key=key, check_name=ATTRIBUTION_SHIFT, passed=True,
                                      metadata={"note": "no rows in the month"})  # fmt: skip
            return
        ref = attribution_summary(reference, tree_shap(booster, feature_matrix(reference, fs)), segments, names)
        shifts = attribution_shift(summary, ref)
        flagged = [s for s in shifts if s.flagged]
        overall = summary.filter(pl.col("segment") == "all").sort("mean_abs", descending=True)
        per_segment = (
            summary.filter(pl.col("segment") != "all")
            .sort("mean_abs", descending=True)
            .group_by("segment", "value", maintain_order=True)
            .agg(pl.col("rows").first(), pl.col("feature").first().alias("top_feature"),
                 pl.col("share").first().round(3).alias("top_share"))
            .sort("segment", "value")
        )  # fmt: skip
        shift_table = pl.DataFrame(
            [
                (s.feature, round(s.share, 4), round(s.reference_share, 4), round(s.moved, 4), s.flagged)
                for s in shifts
            ],
            schema=["feature", "share", "reference_share", "moved", "flagged"],
            orient="row",
        )
        shown = top_features(summary)  # the same features in every bar: this month's largest
        trend = _earlier_months(keel_home.layout().storage, key, uc.months, month, shown) | {
            month: _shares(summary, shown)
        }
        versus = {window: _shares(ref, shown), month: _shares(summary, shown)}
        order = [*shown, "other"]
        plots = (
            svg_markdown(stacked_bars_svg(f"{month} vs reference: share of attribution", versus, "", order=order, totals=False))
            + "\n\n"
            + svg_markdown(stacked_bars_svg("share of attribution by month (the champion's lens)", trend, "", order=order, totals=False))
        )  # fmt: skip
        context.log.info(
            f"explanations {month}: top {', '.join(overall['feature'].head(3))}; shifted: "
            f"{', '.join(s.feature for s in flagged) or 'none'}"
        )
        yield dg.Output(
            summary,
            metadata={
                "model_version": version,
                "model_sha256": sha,
                "rows_explained": features.height,
                "reference_rows_explained": reference.height,
                "top_features": ", ".join(overall["feature"].head(3)),
                "overall": dg.MetadataValue.md(
                    frame_to_markdown(overall.drop("segment", "value"), max_rows=len(names))
                ),
                "by_segment": dg.MetadataValue.md(frame_to_markdown(per_segment, max_rows=40)),
                "shift": dg.MetadataValue.md(frame_to_markdown(shift_table, max_rows=len(names))),
                "plot": dg.MetadataValue.md(plots),
                # numbers Dagster plots across the months (the Plots tab)
                **{
                    f"share_{r['feature']}": dg.MetadataValue.float(round(r["share"], 5))
                    for r in overall.iter_rows(named=True)
                },
            },
        )
        yield dg.AssetCheckResult(
            asset_key=key,
            check_name=ATTRIBUTION_SHIFT,
            passed=not flagged,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "largest_move": shifts[0].feature,
                "moved": dg.MetadataValue.float(round(shifts[0].moved, 4)),
                "threshold": dg.MetadataValue.float(SHIFT_THRESHOLD),
                "flagged": ", ".join(f"{s.feature} {s.reference_share:.1%} → {s.share:.1%}" for s in flagged)
                or "none",
            },
        )

    return [explanations]
