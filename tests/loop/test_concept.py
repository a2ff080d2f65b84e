"""Was it concept drift? (keel/loop/concept.py): on realized labels, whether a served version's estimator's one
assumption held — a covariate shift leaves it holding (and the estimate follows the shift), a change of how the
label follows the features breaks it, in its level or its spread; days that share a shock are one observation each."""

from __future__ import annotations

import numpy as np
import pytest

from keel.loop.concept import concept_drift
from keel.loop.estimate import Calibration, ErrorModel, Estimator, estimate_binary, estimate_regression
from keel.metrics import auc


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def month(n: int, spread: float, slope: float, seed: int, day_shock: float = 0.0, days: int = 30):
    """x ~ N(0, spread) over ``days`` days; the label is 1 with probability sigmoid(slope·x + the day's shock); the
    model's score is sigmoid(2x): calibrated while ``slope`` is 2 and there is no shock."""
    rng = np.random.default_rng(seed)
    day = rng.integers(0, days, n)
    x = rng.normal(0, spread, n)
    shock = rng.normal(0, day_shock, days)[day] if day_shock else 0.0
    y = (rng.random(n) < sigmoid(slope * x + shock)).astype(float)
    return sigmoid(2 * x), y, day


@pytest.fixture(scope="module")
def binary_estimator():
    scores, y, _ = month(40_000, 1.0, 2.0, seed=1)
    return Estimator("binary", "reference", y.size, calibration=Calibration.fit(scores, y))


def test_a_covariate_shift_is_not_concept_drift_and_the_estimate_follows_it(binary_estimator):
    scores, y, day = month(18_000, 0.35, 2.0, seed=2)  # the rows crowd the middle: AUC falls, the relation holds
    verdict = concept_drift(binary_estimator, scores, y, day)
    assert not verdict.drifted and verdict.p_value > 0.05 and verdict.days == 30
    assert abs(estimate_binary(scores, binary_estimator.calibration)["auc"].value - auc(scores, y)) < 0.01
    assert verdict.describe().startswith("no concept drift")


@pytest.mark.parametrize(
    "slope, what",
    [(1.2, "flatter: the scores separate less sharply than they did"), (2.8, "sharper than they did")],
)
def test_a_changed_relation_is_concept_drift_and_explains_the_estimates_miss(binary_estimator, slope, what):
    scores, y, day = month(18_000, 1.0, slope, seed=3)
    estimated = estimate_binary(scores, binary_estimator.calibration)["auc"].value
    assert abs(estimated - auc(scores, y)) > 0.01  # the estimate misses: the scores did not move, the labels did
    verdict = concept_drift(binary_estimator, scores, y, day)
    assert verdict.drifted and verdict.p_value < 0.001, what
    assert verdict.spread == pytest.approx(slope / 2, abs=0.1)  # Cox's slope: the new relation over the old
    assert verdict.describe().startswith("concept drift")


def test_months_of_days_that_share_a_shock_are_judged_by_their_days_not_their_rows():
    """Each day's labels move together (a day's weather) in the reference and in every month after: 18,000 rows are
    30 observations of the level. Twenty months as the reference was: clustered by day, the test calls about one in
    twenty drifted (its level); the same rows taken one by one would call most of them drifted."""
    scores, y, _ = month(60_000, 1.0, 2.0, seed=1, day_shock=0.6, days=300)
    estimator = Estimator("binary", "reference", y.size, calibration=Calibration.fit(scores, y))
    by_day = by_row = 0
    for seed in range(100, 120):
        scores, y, day = month(18_000, 1.0, 2.0, seed=seed, day_shock=0.6)
        by_day += concept_drift(estimator, scores, y, day).drifted
        by_row += concept_drift(estimator, scores, y, np.arange(y.size)).drifted
    assert by_day <= 3 and by_row >= 10, (by_day, by_row)


def test_too_few_days_or_one_class_judge_nothing(binary_estimator):
    scores, y, _ = month(2_000, 1.0, 2.0, seed=6)
    assert concept_drift(binary_estimator, scores, y, np.arange(y.size) % 4) is None  # 4 days
    assert concept_drift(binary_estimator, scores, np.zeros_like(y), np.arange(y.size) % 30) is None


def prices(n: int, seed: int, level: float = 0.0, noise: float = 10.0):
    """A price 100 + 30·x₀ − 20·x₁ with noise; the model knows the mean exactly."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, 2))
    mean = 100 + 30 * x[:, 0] - 20 * x[:, 1]
    return x, mean, mean + level + rng.normal(0, noise, n), rng.integers(0, 30, n)


@pytest.fixture(scope="module")
def regression_estimator():
    x, predicted, y, _ = prices(8_000, seed=1)
    return Estimator("regression", "reference", y.size, error_model=ErrorModel.fit(x, predicted, y))


@pytest.mark.parametrize(
    "level, noise, drifted",
    [
        (0.0, 10.0, False),  # as on the reference rows
        (15.0, 10.0, True),  # every price 15 higher for the same features: the level moved
        (0.0, 20.0, True),  # the same mean, twice the spread: the errors are larger than the error model says
    ],
)
def test_a_regressions_level_or_spread_moving_is_concept_drift(regression_estimator, level, noise, drifted):
    x, predicted, y, day = prices(3_000, seed=2, level=level, noise=noise)
    verdict = concept_drift(regression_estimator, predicted, y, day, x)
    assert verdict.drifted is drifted
    if level:
        assert verdict.level == pytest.approx(level, abs=2.0)
    if noise > 10:
        assert verdict.spread > 4.0  # about 16 − 8: twice the mean absolute error of N(0, 10)
    estimated = estimate_regression(x, predicted, regression_estimator.error_model)["rmse"].value
    realized = float(np.sqrt(np.mean((y - predicted) ** 2)))
    assert (abs(estimated / realized - 1) > 0.10) is drifted  # the estimate misses exactly where the concept moved


def test_a_regressions_tail_growing_is_concept_drift_though_its_absolute_errors_stay(regression_estimator):
    """Three stays in a hundred now miss by N(0, 80) and the rest by N(0, 7.84): the mean absolute error is the
    reference's (0.798 · (0.97 · 7.84 + 0.03 · 80) = 7.98) and so is the level, but the RMSE is 15.9 where the error
    model says 10 — the estimate misses by a third, and only the squared errors show why (the level and the absolute
    errors alone call 0 of 20 such months drifted, measured with seeds 3–22)."""
    rng = np.random.default_rng(3)
    n = 3_000
    x = rng.normal(0, 1, (n, 2))
    predicted = 100 + 30 * x[:, 0] - 20 * x[:, 1]
    wide = rng.random(n) < 0.03
    y = predicted + np.where(wide, rng.normal(0, 80, n), rng.normal(0, 7.6 / 0.97, n))
    day = rng.integers(0, 30, n)
    verdict = concept_drift(regression_estimator, predicted, y, day, x)
    assert abs(verdict.spread) < 1.0  # the absolute errors are where the error model put them
    assert verdict.tail > 2.0 and verdict.drifted
    estimated = estimate_regression(x, predicted, regression_estimator.error_model)["rmse"].value
    realized = float(np.sqrt(np.mean((y - predicted) ** 2)))
    assert estimated / realized - 1 < -0.25


def test_a_regressions_tail_as_on_the_reference_is_not_drift(regression_estimator):
    x, predicted, y, day = prices(3_000, seed=4)
    verdict = concept_drift(regression_estimator, predicted, y, day, x)
    assert not verdict.drifted and verdict.tail == pytest.approx(1.0, abs=0.15)
