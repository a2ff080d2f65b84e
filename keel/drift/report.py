"""Compare a window with a reference profile: per-feature statistics, a verdict per feature, one for the dataset.

Numeric features: Wasserstein-1 distance (raw and divided by the reference standard deviation, so thresholds are
unit-free), Kolmogorov-Smirnov statistic and p-value, PSI over reference deciles, KL(current ‖ reference) over 20
reference quantile bins. Categorical features: Jensen-Shannon distance (base 2), chi-square test, PSI, and the
categories the reference never saw. A numeric feature drifts when its normalised W1 exceeds its threshold (default
0.15, the design articles' figure); a categorical one when its JS distance does (default 0.1). The dataset drifts
when the share of drifted features reaches ``dataset_share`` (default 0.5).

Bad input has defined results, never a crash and never a silent zero: an empty or all-null window gives status
``no_data`` and null statistics; NaN/inf are dropped and counted; a constant reference gives an infinite
normalised distance when anything moved; a feature missing from the window gives status ``missing``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy import stats
from scipy.spatial.distance import jensenshannon

from keel.drift.profile import CategoricalReference, NumericReference, ReferenceProfile
from keel.kernels import ArrayBackend, backend, bin_counts, finite_sorted, wasserstein_ks

EPS = 1e-4  # proportion floor for PSI and KL, so an empty bin gives a large finite value instead of inf
KS_EXACT_MAX = 10_000  # at or below this many values per side, the KS p-value is scipy's exact one


@dataclass
class DriftConfig:
    numeric_threshold: float = 0.15  # normalised Wasserstein distance
    categorical_threshold: float = 0.1  # Jensen-Shannon distance
    thresholds: dict[str, float] = field(default_factory=dict)  # per-feature overrides
    dataset_share: float = 0.5
    error_factor: float = 2.0  # a drifted feature past error_factor × threshold is an ERROR, else a WARN

    def threshold_for(self, feature: str, kind: str) -> float:
        if feature in self.thresholds:
            return self.thresholds[feature]
        return self.numeric_threshold if kind == "numeric" else self.categorical_threshold


@dataclass
class FeatureDrift:
    feature: str
    kind: str
    status: str  # ok | drift | no_data | missing
    drifted: bool | None
    metric: str  # the statistic the verdict uses
    value: float | None
    threshold: float
    severity: str  # none | warn | error
    n_reference: int
    n_current: int
    null_fraction: float | None = None
    non_finite: int = 0
    wasserstein: float | None = None
    wasserstein_norm: float | None = None
    ks: float | None = None
    ks_pvalue: float | None = None
    psi: float | None = None
    kl: float | None = None
    js: float | None = None
    chi2: float | None = None
    chi2_pvalue: float | None = None
    unseen: list[str] = field(default_factory=list)
    reference_mean: float | None = None
    current_mean: float | None = None


@dataclass
class DriftReport:
    window: str
    reference_window: str
    features: list[FeatureDrift]
    dataset_share: float

    @property
    def evaluated(self) -> list[FeatureDrift]:
        return [f for f in self.features if f.drifted is not None]

    @property
    def drifted_features(self) -> list[str]:
        return [f.feature for f in self.features if f.drifted]

    @property
    def drifted_share(self) -> float | None:
        return len(self.drifted_features) / len(self.evaluated) if self.evaluated else None

    @property
    def dataset_drift(self) -> bool | None:
        share = self.drifted_share
        return None if share is None else share >= self.dataset_share

    @property
    def verdict(self) -> str:
        if self.dataset_drift is None:
            return "no_data"
        return "drift" if self.dataset_drift else ("partial_drift" if self.drifted_features else "no_drift")

    def feature(self, name: str) -> FeatureDrift:
        return next(f for f in self.features if f.feature == name)

    def to_frame(self) -> pl.DataFrame:
        rows = [asdict(f) | {"unseen": ",".join(f.unseen)} for f in self.features]
        frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
        return frame.with_columns(
            pl.lit(self.window).alias("window"), pl.lit(self.reference_window).alias("reference_window")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "reference_window": self.reference_window,
            "verdict": self.verdict,
            "dataset_drift": self.dataset_drift,
            "drifted_share": self.drifted_share,
            "drifted_features": self.drifted_features,
            "features": [_clean(asdict(f)) for f in self.features],
        }

    def markdown(self) -> str:
        lines = [
            "| feature | kind | status | metric | value | threshold | KS | PSI | n |",
            "|---|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for f in sorted(self.features, key=lambda f: -(f.value or 0) / (f.threshold or 1)):
            lines.append(
                f"| {f.feature} | {f.kind} | {'**' + f.status + '**' if f.drifted else f.status} | {f.metric} | {_fmt(f.value)} "
                f"| {f.threshold:g} | {_fmt(f.ks)} | {_fmt(f.psi)} | {f.n_current:,} |"
            )
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if math.isinf(v):
        return "∞"
    return f"{v:.3f}"


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def _binned(b: ArrayBackend, sorted_values: Any, edges: np.ndarray) -> np.ndarray:
    return b.to_numpy(bin_counts(b, sorted_values, b.asarray(edges))).astype(np.float64)


def _psi(ref_counts: np.ndarray, cur_counts: np.ndarray) -> float:
    p = np.maximum(ref_counts / ref_counts.sum(), EPS)
    q = np.maximum(cur_counts / cur_counts.sum(), EPS)
    return float(np.sum((q - p) * np.log(q / p)))


def _kl(ref_counts: np.ndarray, cur_counts: np.ndarray) -> float:
    p = np.maximum(ref_counts / ref_counts.sum(), EPS)
    q = np.maximum(cur_counts / cur_counts.sum(), EPS)
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(q * np.log(q / p)))


def _ks_pvalue(d: float, n: int, m: int, ref: Any, cur: Any, b: ArrayBackend) -> float:
    """scipy's p-value: exact for samples of ≤ 10,000 values; beyond, the asymptotic distribution. scipy evaluates
    the finite-n Kolmogorov distribution there (``kstwo``, ~0.1 s per value at n = 10^5); keel uses its limit
    (``kstwobign``), which differs by < 3e-3 at n·m/(n+m) = 10^4 and < 4e-4 at 5·10^5 (docs/drift.md)."""
    if max(n, m) <= KS_EXACT_MAX:
        return float(stats.ks_2samp(b.to_numpy(ref), b.to_numpy(cur)).pvalue)
    en = n * m / (n + m)
    return float(stats.kstwobign.sf(d * np.sqrt(en)))


def _severity(drifted: bool | None, value: float | None, threshold: float, config: DriftConfig) -> str:
    if not drifted:
        return "none"
    return "error" if value is not None and value > config.error_factor * threshold else "warn"


def _numeric(
    ref: NumericReference, values: pl.Series | None, config: DriftConfig, b: ArrayBackend, pool: Any = None
) -> FeatureDrift:
    threshold = config.threshold_for(ref.name, "numeric")
    base = {
        "feature": ref.name,
        "kind": "numeric",
        "metric": "wasserstein_norm",
        "threshold": threshold,
        "n_reference": int(ref.sorted_values.size),
        "reference_mean": ref.mean,
    }
    if values is None:
        return FeatureDrift(status="missing", drifted=None, value=None, severity="none", n_current=0, **base)
    rows = values.len()
    nulls = values.null_count()
    raw = values.drop_nulls().cast(pl.Float64, strict=False).drop_nulls().to_numpy()
    cur = finite_sorted(b, pool.asarray(raw) if pool is not None else raw)
    m = int(cur.size)
    common = {"null_fraction": nulls / rows if rows else None, "non_finite": int(raw.size - m)}
    if m == 0 or ref.sorted_values.size == 0:
        return FeatureDrift(
            status="no_data", drifted=None, value=None, severity="none", n_current=m, **base, **common
        )
    ref_arr = b.asarray(ref.sorted_values)
    w, ks = wasserstein_ks(b, ref_arr, cur)
    if ref.std > 0:
        w_norm = w / ref.std
    else:  # a constant reference: any movement is infinitely far in reference units
        w_norm = 0.0 if w == 0 else math.inf
    drifted = w_norm > threshold
    return FeatureDrift(
        status="drift" if drifted else "ok",
        drifted=drifted,
        value=w_norm,
        severity=_severity(drifted, w_norm, threshold, config),
        n_current=m,
        wasserstein=w,
        wasserstein_norm=w_norm,
        ks=ks,
        ks_pvalue=_ks_pvalue(ks, int(ref.sorted_values.size), m, ref_arr, cur, b),
        psi=_psi(ref.psi_counts, _binned(b, cur, ref.psi_edges)),
        kl=_kl(ref.kl_counts, _binned(b, cur, ref.kl_edges)),
        current_mean=float(b.xp.mean(cur)),
        **base,
        **common,
    )


def _categorical(ref: CategoricalReference, values: pl.Series | None, config: DriftConfig) -> FeatureDrift:
    threshold = config.threshold_for(ref.name, "categorical")
    base = {
        "feature": ref.name,
        "kind": "categorical",
        "metric": "js",
        "threshold": threshold,
        "n_reference": ref.rows - ref.nulls,
    }
    if values is None:
        return FeatureDrift(status="missing", drifted=None, value=None, severity="none", n_current=0, **base)
    text = values.cast(pl.String)
    rows, nulls = text.len(), text.null_count()
    vc = text.drop_nulls().value_counts()
    cur_counts = dict(zip(vc[text.name].to_list(), vc["count"].to_list(), strict=True))
    m = sum(cur_counts.values())
    common = {"null_fraction": nulls / rows if rows else None}
    if m == 0 or not ref.counts:
        return FeatureDrift(
            status="no_data", drifted=None, value=None, severity="none", n_current=m, **base, **common
        )
    cats = list(ref.counts) + sorted(c for c in cur_counts if c not in ref.counts)
    p = np.asarray([ref.counts.get(c, 0) for c in cats], dtype=np.float64)
    q = np.asarray([cur_counts.get(c, 0) for c in cats], dtype=np.float64)
    js = float(jensenshannon(p / p.sum(), q / q.sum(), base=2))
    if len(cats) > 1:
        chi2, chi2_p, _, _ = stats.chi2_contingency(np.vstack([p, q]), correction=False)
    else:
        chi2, chi2_p = 0.0, 1.0
    drifted = js > threshold
    return FeatureDrift(
        status="drift" if drifted else "ok",
        drifted=drifted,
        value=js,
        severity=_severity(drifted, js, threshold, config),
        n_current=m,
        js=js,
        chi2=float(chi2),
        chi2_pvalue=float(chi2_p),
        psi=_psi(p, q),
        unseen=[c for c in cats if c not in ref.counts],
        **base,
        **common,
    )


def compare(
    profile: ReferenceProfile,
    current: pl.DataFrame,
    *,
    window: str,
    config: DriftConfig | None = None,
    features: list[str] | None = None,
    b: ArrayBackend | None = None,
    pool: Any = None,
) -> DriftReport:
    """Measure ``current`` against ``profile`` for every profiled feature (or the ``features`` named).

    ``pool`` (a gpu_runtime.pools.ModelMemoryPool): the model's memory pool; the kernels' arrays come from it, and
    going over its limit raises PoolBudgetExceeded for that model."""
    config = config or DriftConfig()
    if pool is not None:
        b = pool.backend
        with pool.use():
            return _compare(profile, current, window, config, features, b, pool)
    return _compare(profile, current, window, config, features, b or backend(), None)


def _compare(
    profile: ReferenceProfile,
    current: pl.DataFrame,
    window: str,
    config: DriftConfig,
    features: list[str] | None,
    b: ArrayBackend,
    pool: Any,
) -> DriftReport:
    names = features if features is not None else list(profile.features)
    results = []
    for name in names:
        ref = profile.features.get(name)
        if ref is None:
            raise KeyError(f"feature '{name}' is not in the reference profile ({', '.join(profile.features)})")
        column = current[name] if name in current.columns else None
        if isinstance(ref, NumericReference):
            results.append(_numeric(ref, column, config, b, pool))
        else:
            results.append(_categorical(ref, column, config))
    return DriftReport(
        window=window, reference_window=profile.window, features=results, dataset_share=config.dataset_share
    )
