"""Checks on the two feature paths: training/serving skew, online distribution, and feature health.

Pure functions over frames and the store interface; assets/features.py turns their results into asset checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from keel.features.online import OnlineStore, get_online_features
from keel.features.spec import FeatureSet

FLOAT_TOLERANCE = 1e-9  # relative, for float features; categoricals and integers must match exactly


@dataclass
class SkewReport:
    compared: int
    mismatches: dict[str, int] = field(default_factory=dict)  # feature -> rows that differ
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # feature -> a few (key, offline, online)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _same(a: Any, b: Any, is_float: bool) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if is_float:
        return math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=1e-12)
    return a == b


def training_serving_skew(
    fs: FeatureSet, offline: pl.DataFrame, online: list[dict[str, Any]], keys: list[str]
) -> SkewReport:
    """Compare offline rows with the online answers for the same entities, field by field."""
    report = SkewReport(compared=len(online))
    for key, want, got in zip(keys, offline.iter_rows(named=True), online, strict=True):
        for f in fs.features:
            if f.name in got.get("degraded", []):
                continue  # a frozen feature is served on purpose with its freeze value
            if not _same(want[f.name], got[f.name], f.dtype == "float"):
                report.mismatches[f.name] = report.mismatches.get(f.name, 0) + 1
                examples = report.examples.setdefault(f.name, [])
                if len(examples) < 3:
                    examples.append({"key": key, "offline": want[f.name], "online": got[f.name]})
    return report


def population_stability(
    expected: np.ndarray, actual: np.ndarray, edges: np.ndarray, eps: float = 1e-4
) -> float | None:
    """PSI of ``actual`` against ``expected`` over the given inner bin edges; None when either side is empty."""
    expected = expected[np.isfinite(expected)]
    actual = actual[np.isfinite(actual)]
    if expected.size == 0 or actual.size == 0:
        return None
    e = np.bincount(np.searchsorted(edges, expected, side="left"), minlength=edges.size + 1) / expected.size
    a = np.bincount(np.searchsorted(edges, actual, side="left"), minlength=edges.size + 1) / actual.size
    e, a = np.maximum(e, eps), np.maximum(a, eps)
    return float(np.sum((a - e) * np.log(a / e)))


def value_centred_stability(expected: np.ndarray, actual: np.ndarray, eps: float = 1e-4) -> float | None:
    """PSI for few-valued features: one bin per distinct ``expected`` value, with edges half-way between
    neighbouring values. Fixed-width bins put a 0.001 move across an edge into another bin (16 delay rates in
    0.05-wide bins); here a value has to move half the gap to its neighbour to change bins."""
    expected = expected[np.isfinite(expected)]
    values = np.unique(np.round(expected, 9))
    edges = (values[1:] + values[:-1]) / 2
    return population_stability(expected, actual, edges, eps)


@dataclass(frozen=True)
class FeatureStability:
    feature: str
    # "values" (few-valued: one bin per value, edges half-way between values), "bins" (equal-width bins of the declared range), or "frozen" (served
    # with its freeze value on purpose: not compared)
    measure: str
    psi: float | None
    distinct: int  # distinct offline values


def online_distribution(
    fs: FeatureSet, offline_rows: pl.DataFrame, online: list[dict[str, Any]], *, bins: int = 20, max_values: int = 32
) -> list[FeatureStability]:
    """Per feature, PSI of the online answers against the offline rows *for the same rows as of the same time*
    (the caller computes both sides as of the store's snapshot), so a difference is the serving path's, not time's.

    A feature with at most ``max_values`` distinct offline values (delay rates early in the year, categorical
    codes) is binned around its values (``value_centred_stability``); others over ``bins`` equal-width bins of the
    feature's declared range. A frozen feature is served with its freeze value on purpose and is not compared."""
    out = []
    for f in fs.features:
        expected = offline_rows[f.name].drop_nulls().cast(pl.Float64).to_numpy()
        distinct = int(np.unique(np.round(expected[np.isfinite(expected)], 9)).size)
        if online and all(f.name in r.get("degraded", ()) for r in online):
            out.append(
                FeatureStability(f.name, "frozen", None, distinct)
            )  # served frozen on purpose: nothing to compare
            continue
        served = np.asarray(
            [r[f.name] for r in online if r[f.name] is not None and f.name not in r.get("degraded", ())],
            dtype=np.float64,
        )
        if distinct <= max_values:
            out.append(FeatureStability(f.name, "values", value_centred_stability(expected, served), distinct))
        else:
            edges = np.linspace(f.lo, f.hi, bins + 1)[1:-1]
            out.append(FeatureStability(f.name, "bins", population_stability(expected, served, edges), distinct))
    return out


@dataclass
class HealthReport:
    reachable: bool
    fresh: bool
    last_write_at: datetime | None
    problems: list[str] = field(default_factory=list)
    sampled: int = 0

    @property
    def healthy(self) -> bool:
        return self.reachable and self.fresh and not self.problems


def feature_health(
    store: OnlineStore, hot_rows: list[dict[str, Any]], *, max_age: timedelta, now: datetime | None = None
) -> HealthReport:
    """Healthy means useful supply: reachable, written recently, and hot keys served non-null and in range."""
    h = store.health()
    now = now or datetime.now(UTC)
    if not h.reachable:
        return HealthReport(False, False, None, [f"store unreachable: {h.error}"])
    fresh = h.last_write_at is not None and now - h.last_write_at <= max_age
    report = HealthReport(
        True, fresh, h.last_write_at, [] if fresh else [f"last write {h.last_write_at} is older than {max_age}"]
    )
    if not hot_rows:
        report.problems.append("no hot keys to read back: nothing was verified")
    served = get_online_features(store, hot_rows) if hot_rows else []
    report.sampled = len(served)
    for spec in store.features.features:
        name = spec.name
        values = [r[name] for r in served]
        nulls = sum(v is None for v in values)
        if served and nulls:
            report.problems.append(f"{name}: {nulls}/{len(served)} hot keys null")
        bad = [v for v in values if v is not None and not (spec.lo <= v <= spec.hi)]
        if bad:
            report.problems.append(f"{name}: {len(bad)} values outside [{spec.lo:g}, {spec.hi:g}], e.g. {bad[0]}")
    return report
