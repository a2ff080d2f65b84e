"""Why the model said so: exact TreeSHAP for the LightGBM model, LIME as the model-agnostic comparison, and
attribution summaries over time.

- ``feature_matrix``: rows → the float matrix the model scores, missing values filled with the reference defaults
  (what the gateway serves; keel/features/definitions.py);
- ``tree_shap``: LightGBM's ``pred_contrib`` — per row, each feature's contribution to the raw score (log-odds)
  and the base value; they add up to the raw score exactly (the same numbers the Triton model returns);
- ``compare_lime``: LIME (``lime.lime_tabular``, a weighted linear surrogate fitted on perturbations around each
  row) next to TreeSHAP for the same rows — rank agreement (Spearman's ρ of |weight| vs |contribution|), the
  overlap of their top-k features and the sign agreement there — and what each costs relative to plain inference;
- ``attribution_summary`` / ``attribution_shift``: mean |contribution| per feature and segment (carrier, origin) and
  each feature's share of the total, and how far the shares moved from a reference window — the ``explanations``
  asset's numbers and its check.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from keel.features.spec import FeatureSet

SHIFT_THRESHOLD = 0.10  # a feature whose share of attribution moves by more than this (absolute) is flagged
SAMPLE_ROWS = 5000  # rows explained per month (and of the reference window): TreeSHAP costs ~0.2–0.5 ms each


def explanation_sample(frame: pl.DataFrame, fs: FeatureSet, n: int = SAMPLE_ROWS, seed: int = 2013) -> pl.DataFrame:
    """A seeded sample of ``n`` rows (all of them when there are fewer), in row order: a mean |contribution|
    over 5,000 rows is within a few percent of the whole month's (its relative standard error)."""
    if frame.height <= n:
        return frame
    ids = fs.entity.id_column
    return frame.sort(ids).sample(n, seed=seed).sort(ids)


def feature_matrix(frame: pl.DataFrame, fs: FeatureSet) -> np.ndarray:
    """The rows as the model's float inputs, in the feature set's order, missing values as its defaults."""
    x = frame.select([pl.col(n).cast(pl.Float64) for n in fs.names]).to_numpy()
    return np.where(np.isnan(x), fs.defaults, x)


def tree_shap(booster, x: np.ndarray) -> np.ndarray:
    """[n, n_features + 1]: contributions in log-odds, the base value last (no rows: an empty matrix — a month
    without rows explains nothing)."""
    if x.shape[0] == 0:
        return np.zeros((0, booster.num_feature() + 1))
    return booster.predict(x, pred_contrib=True, num_threads=1)


# -- LIME next to TreeSHAP ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowComparison:
    row_id: str
    score: float
    spearman: float  # rank agreement of |LIME weight| and |TreeSHAP contribution| over all features
    top_k_overlap: float  # share of TreeSHAP's top-k features that are in LIME's top-k
    top_k_sign_agreement: float  # of those shared, the share whose direction (raises / lowers the risk) agrees
    shap_top: list[tuple[str, float]]
    lime_top: list[tuple[str, float]]


@dataclass(frozen=True)
class LimeComparison:
    model_version: int | None
    rows: int
    samples: int
    top_k: int
    median_spearman: float
    median_top_k_overlap: float
    median_top_k_sign_agreement: float
    inference_ms_per_row: float  # Booster.predict of one row
    tree_shap_ms_per_row: float
    lime_ms_per_row: float
    per_row: list[RowComparison] = field(default_factory=list)

    @property
    def lime_cost_x(self) -> float:
        return self.lime_ms_per_row / self.inference_ms_per_row

    @property
    def tree_shap_cost_x(self) -> float:
        return self.tree_shap_ms_per_row / self.inference_ms_per_row

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"lime_cost_x": self.lime_cost_x, "tree_shap_cost_x": self.tree_shap_cost_x}

    def summary(self) -> str:
        return (
            f"LIME vs TreeSHAP on {self.rows} rows ({self.samples} LIME samples each): rank agreement "
            f"(Spearman ρ of |attribution|) median {self.median_spearman:.2f}; top-{self.top_k} overlap median "
            f"{self.median_top_k_overlap:.0%}, sign agreement there {self.median_top_k_sign_agreement:.0%}. Cost per "
            f"row: inference {self.inference_ms_per_row:.3f} ms, TreeSHAP {self.tree_shap_ms_per_row:.3f} ms "
            f"({self.tree_shap_cost_x:.1f}×), LIME {self.lime_ms_per_row:.1f} ms ({self.lime_cost_x:,.0f}×)"
        )


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def _top(names_values: np.ndarray, k: int) -> list[int]:
    return list(np.argsort(-np.abs(names_values), kind="stable")[:k])


def compare_lime(
    booster,
    fs: FeatureSet,
    background: np.ndarray,
    x: np.ndarray,
    row_ids: list[str],
    *,
    samples: int = 5000,
    top_k: int = 5,
    seed: int = 2013,
    model_version: int | None = None,
) -> LimeComparison:
    """LIME's local weights next to TreeSHAP's contributions for each row of ``x``. ``background``: the rows LIME
    learns feature scales from (the month's rows). Timings are medians per row, measured in this process."""
    from lime.lime_tabular import LimeTabularExplainer

    explainer = LimeTabularExplainer(
        background, feature_names=list(fs.names), class_names=list(fs.label.classes),
        mode="classification",
        random_state=seed,
    )  # fmt: skip

    def proba(rows: np.ndarray) -> np.ndarray:
        p = booster.predict(rows, num_threads=1)
        return np.column_stack([1 - p, p])

    names = fs.names
    shap = tree_shap(booster, x)
    scores = booster.predict(x, num_threads=1)
    per_row, lime_ms = [], []
    for i, fid in enumerate(row_ids):
        t0 = time.perf_counter()
        exp = explainer.explain_instance(x[i], proba, num_features=len(names), num_samples=samples, labels=(1,))
        lime_ms.append((time.perf_counter() - t0) * 1000)
        weights = np.zeros(len(names))
        for j, w in exp.as_map()[1]:
            weights[j] = w
        contrib = shap[i, :-1]
        rho = spearmanr(np.abs(weights), np.abs(contrib)).statistic
        top_shap, top_lime = _top(contrib, top_k), _top(weights, top_k)
        shared = [j for j in top_shap if j in top_lime]
        signs = [np.sign(weights[j]) == np.sign(contrib[j]) for j in shared]
        per_row.append(
            RowComparison(
                fid, float(scores[i]), float(rho) if np.isfinite(rho) else 0.0, len(shared) / top_k,
                float(np.mean(signs)) if signs else 0.0,
                [(names[j], float(contrib[j])) for j in top_shap],
                [(names[j], float(weights[j])) for j in top_lime],
            )
        )  # fmt: skip
    one = x[:1]
    repeats = max(50, len(row_ids))
    return LimeComparison(
        model_version=model_version,
        rows=len(row_ids),
        samples=samples,
        top_k=top_k,
        median_spearman=float(np.median([f.spearman for f in per_row])),
        median_top_k_overlap=float(np.median([f.top_k_overlap for f in per_row])),
        median_top_k_sign_agreement=float(np.median([f.top_k_sign_agreement for f in per_row])),
        inference_ms_per_row=_median_ms(lambda: booster.predict(one, num_threads=1), repeats),
        tree_shap_ms_per_row=_median_ms(lambda: booster.predict(one, pred_contrib=True, num_threads=1), repeats),
        lime_ms_per_row=float(np.median(lime_ms)),
        per_row=per_row,
    )


# -- attribution over time ----------------------------------------------------------------------------------------


def attribution_summary(
    frame: pl.DataFrame, contrib: np.ndarray, segments: tuple[str, ...], names: tuple[str, ...]
) -> pl.DataFrame:
    """Mean |contribution| per feature (``names``: the model's inputs, in order): overall (segment ``all``) and per
    value of each segment column, with each feature's share of the segment's total and the rows behind it. Long
    form: one row per segment × feature."""
    abs_c = pl.DataFrame(np.abs(contrib[:, :-1]), schema=list(names), orient="row")
    parts = [abs_c.with_columns(pl.lit("all").alias("segment"), pl.lit("all").alias("value"))]
    for col in segments:
        parts.append(abs_c.with_columns(pl.lit(col).alias("segment"), frame[col].cast(pl.Utf8).alias("value")))
    wide = pl.concat(parts)
    means = wide.group_by("segment", "value").agg(pl.len().alias("rows"), *[pl.col(n).mean() for n in names])
    long = means.unpivot(index=["segment", "value", "rows"], variable_name="feature", value_name="mean_abs")
    return long.with_columns(
        (pl.col("mean_abs") / pl.col("mean_abs").sum().over("segment", "value")).alias("share")
    ).sort("segment", "value", "feature")


@dataclass(frozen=True)
class AttributionShift:
    feature: str
    share: float
    reference_share: float

    @property
    def moved(self) -> float:
        return self.share - self.reference_share

    @property
    def flagged(self) -> bool:
        return abs(self.moved) > SHIFT_THRESHOLD


def attribution_shift(current: pl.DataFrame, reference: pl.DataFrame) -> list[AttributionShift]:
    """Per feature, its share of all attribution now and in the reference window (segment ``all``), largest move
    first. A share that moves by more than SHIFT_THRESHOLD flags: what drives the predictions changed sharply."""
    now = dict(current.filter(pl.col("segment") == "all").select("feature", "share").iter_rows())
    ref = dict(reference.filter(pl.col("segment") == "all").select("feature", "share").iter_rows())
    features = [*now, *(f for f in ref if f not in now)]
    out = [AttributionShift(f, float(now.get(f, 0.0)), float(ref.get(f, 0.0))) for f in features]
    return sorted(out, key=lambda s: -abs(s.moved))
