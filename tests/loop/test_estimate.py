"""Quality before the labels (keel/loop/estimate.py): the expectations are what the labels then give on average, a
covariate shift's effect on quality is seen in the scores alone, and a concept shift — invisible in the scores — is
missed by the estimate and caught by the outcome gate on realized labels."""

from __future__ import annotations

import numpy as np
import pytest

from keel.loop.estimate import (
    Calibration,
    ErrorModel,
    Estimate,
    compare,
    estimate_binary,
    estimate_regression,
    expected_auc,
    expected_log_loss,
)
from keel.loop.gate import ChallengerGatePolicy, challenger_gate
from keel.metrics import auc, per_row_loss

RNG = np.random.default_rng(62)


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def world(n: int, spread: float, slope: float = 2.0, seed: int = 1):
    """x ~ N(0, spread); the label is 1 with probability sigmoid(slope·x); the model's score is sigmoid(2x)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, spread, n)
    y = (rng.random(n) < sigmoid(slope * x)).astype(float)
    return x, sigmoid(2 * x), y


def test_the_calibration_recovers_the_probability_a_miscalibrated_score_means():
    x, _, y = world(50_000, 1.0)
    overconfident = sigmoid(4 * x)  # ranks right, says 0.98 where the truth is 0.88
    cal = Calibration.fit(overconfident, y)
    assert cal.slope == pytest.approx(0.5, abs=0.03) and cal.intercept == pytest.approx(0.0, abs=0.03)
    probe = sigmoid(4 * np.array([-1.0, 0.0, 0.5, 1.0]))
    np.testing.assert_allclose(cal(probe), sigmoid(2 * np.array([-1.0, 0.0, 0.5, 1.0])), atol=0.01)
    with pytest.raises(ValueError, match="at least 30"):
        Calibration.fit(np.array([0.1, 0.2]), np.array([0.0, 1.0]))


def test_the_expected_auc_and_log_loss_are_what_the_labels_give_on_average():
    """Labels drawn as the probabilities say, 300 times: the realized AUC and log-loss average to the expectation,
    and spread as the standard errors say."""
    n = 4000
    q = sigmoid(RNG.normal(0, 1.5, n))
    scores = np.clip(q + RNG.normal(0, 0.05, n), 0.01, 0.99)  # served scores that are not exactly q
    draws = RNG.random((300, n)) < q
    aucs = np.array([auc(scores, d) for d in draws])
    losses = np.array([per_row_loss("binary", scores, d).mean() for d in draws])
    a, a_se = expected_auc(scores, q)
    ll, ll_se = expected_log_loss(scores, q)
    assert abs(aucs.mean() - a) < 3 * a_se / np.sqrt(300) + 1e-4
    assert abs(losses.mean() - ll) < 3 * ll_se / np.sqrt(300)
    assert 0.7 < aucs.std() / a_se < 1.4 and 0.8 < losses.std() / ll_se < 1.25


def test_ties_count_half_and_a_constant_score_estimates_an_auc_of_one_half():
    q = RNG.random(1000)
    assert expected_auc(np.full(1000, 0.3), q)[0] == pytest.approx(0.5)


def test_a_covariate_shift_that_lowers_quality_is_seen_before_the_labels():
    """The reference month's rows spread wide; the shifted month's crowd the middle, where the model is unsure: its
    AUC falls from ~0.80 to ~0.64. The estimate from the scores alone (the reference's calibration) finds the fall,
    within 0.01 of the realized AUC, and judges the shifted arm surely worse."""
    _, ref_scores, ref_y = world(40_000, 1.0, seed=2)
    cal = Calibration.fit(ref_scores, ref_y)
    _, before_scores, before_y = world(20_000, 1.0, seed=3)
    _, after_scores, after_y = world(20_000, 0.35, seed=4)
    before, after = estimate_binary(before_scores, cal), estimate_binary(after_scores, cal)
    realized_before, realized_after = auc(before_scores, before_y), auc(after_scores, after_y)
    assert realized_before - realized_after > 0.1  # the planted shift's known effect
    assert abs(after["auc"].value - realized_after) < 0.01 and abs(before["auc"].value - realized_before) < 0.01
    assert compare(after["auc"], before["auc"], margin=0.01).worse
    assert abs(after["log_loss"].value - per_row_loss("binary", after_scores, after_y).mean()) < 0.01


def test_a_concept_shift_is_invisible_to_the_estimate_and_the_outcome_gate_catches_it():
    """The features stay; how the label follows them weakens (slope 2 → 0.5). The champion's scores look as before,
    so its estimate says nothing changed — while its realized AUC fell and its log-loss rose. A challenger refitted on
    the new concept scores sigmoid(0.5x): judged on realized labels, the outcome gate passes it."""
    _, ref_scores, ref_y = world(40_000, 1.0, seed=5)
    cal = Calibration.fit(ref_scores, ref_y)
    x, champion_scores, y = world(20_000, 1.0, slope=0.5, seed=6)
    estimate = estimate_binary(champion_scores, cal)
    realized_auc = auc(champion_scores, y)
    assert estimate["auc"].value - realized_auc > 0.1  # blind: the scores did not move
    verdict = challenger_gate(y, champion_scores, sigmoid(0.5 * x), ChallengerGatePolicy(), task="binary")
    assert verdict.passed, verdict.reason


def test_the_direct_loss_estimate_follows_a_heteroscedastic_error_into_a_shifted_month():
    """A regression whose error grows with x: fitted on a reference month centred at 0, the error model predicts the
    MAE and RMSE of a month shifted to where the errors are larger, within 10 % of the realized ones."""

    def month(n, centre, seed):
        rng = np.random.default_rng(seed)
        x = rng.normal(centre, 1.0, n)
        noise = rng.normal(0, 1 + np.abs(x), n)
        prediction = 3 * x
        return x, prediction, prediction + noise

    model = ErrorModel.fit(*month(20_000, 0.0, 7))
    for centre, seed in ((0.0, 8), (2.0, 9)):
        x, prediction, label = month(10_000, centre, seed)
        est = estimate_regression(x, prediction, model)
        residual = label - prediction
        assert abs(est["mae"].value / np.abs(residual).mean() - 1) < 0.10, centre
        assert abs(est["rmse"].value / np.sqrt((residual**2).mean()) - 1) < 0.10, centre
    shifted = estimate_regression(*month(10_000, 2.0, 10)[:2], model)
    steady = estimate_regression(*month(10_000, 0.0, 11)[:2], model)
    assert compare(shifted["rmse"], steady["rmse"], margin=0.1).worse


def test_an_arm_the_estimates_cannot_tell_apart_is_neither_worse_nor_surely_not_worse():
    a, b = Estimate("auc", 0.70, 0.02, 500), Estimate("auc", 0.71, 0.02, 500)
    verdict = compare(a, b, margin=0.0)
    assert not verdict.worse and not verdict.not_worse
    assert compare(Estimate("auc", 0.60, 0.005, 9000), b, margin=0.01).worse
    assert compare(Estimate("auc", 0.72, 0.002, 9000), Estimate("auc", 0.71, 0.002, 9000), 0.0).not_worse
    with pytest.raises(ValueError, match="cannot compare"):
        compare(a, Estimate("log_loss", 0.5, 0.01, 500), 0.0)
    assert estimate_binary(np.array([0.2] * 10), Calibration(1.0, 0.0)) == {}


def test_a_canary_acts_on_estimates_only_once_they_held_three_reported_months_in_a_row():
    from keel.loop.estimate import canary_estimate

    held = [[True], [True, True], [True]]
    setting = canary_estimate("binary", 0.02, held)
    assert setting is not None and (setting["metric"], setting["margin"]) == ("log_loss", 0.02)
    assert canary_estimate("binary", 0.02, [[False], *held]) is not None  # an old miss, three held since
    assert canary_estimate("binary", 0.02, [*held[:2], [True, False]]) is None  # one version missed last month
    assert canary_estimate("binary", 0.02, held[:2]) is None  # two months: not yet
    assert canary_estimate("binary", 0.02, [[True], [], [True]]) is None  # a month with no estimate breaks the run
    assert canary_estimate("regression", 0.02, held) is None  # its error model needs features the log lacks
