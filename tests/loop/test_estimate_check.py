"""The loop report's ``estimate_held`` check says why an estimate missed: concept drift found on the labels, the
estimator's own error, or a month whose rows cannot tell the miss from their own sampling noise (issue 62)."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pytest

from assets.estimates import estimate_check, estimates_table
from keel.loop.concept import ConceptDrift
from keel.loop.report import EstimateRecord, realized_rmse_se

KEY = dg.AssetKey(["hotels", "loop_report"])
NO_DRIFT = ConceptDrift(False, 0.4, 1.0, 0.5, 30, "regression", 1.05)
DRIFT = ConceptDrift(True, 0.001, 25.0, 9.0, 30, "regression", 1.8)


def record(estimated: float, realized: float, se: float | None, concept=NO_DRIFT) -> EstimateRecord:
    error = estimated / realized - 1
    return EstimateRecord("rmse", estimated, 1.0, realized, error, abs(error) <= 0.10, 500, concept, se)


def test_a_miss_inside_the_months_own_noise_is_said_to_be_that():
    small_month = record(26.0, 40.0, se=8.0)  # −35 %, the realized RMSE known to ±16 (95 %)
    check = estimate_check(KEY, [(1, small_month)])
    assert small_month.within_noise and not check.passed
    assert (
        "on v1 no concept drift found and the miss inside the realized value's own 95 % interval" in check.description
    )
    assert "own error" not in check.description


def test_a_miss_beyond_the_noise_without_drift_is_the_estimators_own_error():
    check = estimate_check(KEY, [(3, record(30.0, 38.0, se=2.0)), (1, record(40.0, 41.0, se=2.0))])
    assert "the estimator's own error on v3 (no concept drift found)" in check.description
    assert "v1" not in check.description.split("labels:")[0]  # v1 held: not among the causes


def test_a_miss_with_concept_drift_says_so_and_the_table_carries_the_noise():
    drifted = record(30.0, 50.0, se=1.5, concept=DRIFT)
    check = estimate_check(KEY, [(2, drifted)])
    assert "concept drift: the labels moved where the scores did not" in check.description
    [row] = [r.data for r in estimates_table([(2, drifted)]).value.records]
    assert row["realized_se"] == 1.5 and row["within_noise"] is False and row["concept_drift"] is True


def test_the_realized_rmse_standard_error_is_the_spread_of_the_rmse_over_days_resampled():
    """Clustered by day: days whose errors move together make the RMSE less sure than its rows' count says; the
    delta-method standard error agrees with a bootstrap over days."""
    rng = np.random.default_rng(5)
    days = np.repeat(np.arange(40), 25)
    scale = np.exp(rng.normal(0, 0.4, 40))[days]  # a day's prices err together
    y = 100 + rng.normal(0, 20, days.size) * scale
    s = np.full(days.size, 100.0)
    se = realized_rmse_se(s, y, days)
    boot = []
    for _ in range(2_000):
        pick = rng.integers(0, 40, 40)
        rows = np.concatenate([np.flatnonzero(days == d) for d in pick])
        boot.append(np.sqrt(np.mean((y[rows] - s[rows]) ** 2)))
    assert se == pytest.approx(np.std(boot), rel=0.2)
    naive = np.std((y - s) ** 2) / np.sqrt(days.size) / (2 * np.sqrt(np.mean((y - s) ** 2)))
    assert se > 1.3 * naive  # rows taken one by one would claim the month knows its RMSE better than it does
    assert realized_rmse_se(s[:25], y[:25], days[:25]) is None  # one day: nothing to say
