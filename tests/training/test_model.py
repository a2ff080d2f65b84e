"""Training is deterministic; metrics match reference formulas; the gate is a decision with reasons."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from keel.training.model import (
    GatePolicy,
    TrainingConfig,
    auc,
    brier,
    ece,
    evaluate,
    log_loss,
    month_of,
    quality_gate,
    train_model,
)
from usecases.flights.features import FLIGHT_FEATURES

SMALL = TrainingConfig(train_months=("2013-01",), valid_month="2013-02", num_boost_round=60)


def test_same_data_config_and_seed_give_a_byte_identical_model(feature_months):
    a = train_model(feature_months, SMALL, FLIGHT_FEATURES)
    b = train_model(
        feature_months.sample(fraction=1.0, shuffle=True, seed=3), SMALL, FLIGHT_FEATURES
    )  # row order does not matter
    assert a.text == b.text and a.sha256 == b.sha256
    other_seed = TrainingConfig(
        train_months=SMALL.train_months,
        valid_month=SMALL.valid_month,
        num_boost_round=60,
        params=SMALL.params | {"seed": 99},
    )
    assert train_model(feature_months, other_seed, FLIGHT_FEATURES).sha256 != a.sha256


def test_evaluation_on_real_features(feature_months):
    model = train_model(feature_months, SMALL, FLIGHT_FEATURES)
    e = evaluate(
        model.text, month_of(feature_months, "2013-03", FLIGHT_FEATURES), ("carrier", "origin"), fs=FLIGHT_FEATURES
    )
    m = e.as_metrics()
    assert set(m) == {"auc", "log_loss", "brier", "ece"} and e.task == "binary"
    assert 0.6 < m["auc"] < 0.95 and 0 < m["brier"] < 0.25 and 0 <= m["ece"] < 0.1
    assert set(e.segments) == {"carrier", "origin"} and set(e.segments["origin"]) == {"EWR", "JFK", "LGA"}
    assert abs(sum(e.importance.values()) - 1.0) < 1e-9


def test_metrics_against_references():
    rng = np.random.default_rng(0)
    labels = (rng.random(5000) < 0.3).astype(float)
    scores = np.clip(labels * 0.3 + rng.random(5000) * 0.7, 0, 1)
    u = stats.mannwhitneyu(scores[labels == 1], scores[labels == 0]).statistic
    assert auc(scores, labels) == pytest.approx(u / ((labels == 1).sum() * (labels == 0).sum()))
    assert log_loss(scores, labels) == pytest.approx(
        -np.mean(labels * np.log(np.clip(scores, 1e-15, 1)) + (1 - labels) * np.log(np.clip(1 - scores, 1e-15, 1)))
    )
    assert brier(scores, labels) == pytest.approx(np.mean((scores - labels) ** 2))
    assert ece(np.full(100, 0.25), np.r_[np.ones(25), np.zeros(75)]) == pytest.approx(0.0)
    assert ece(np.full(100, 0.9), np.zeros(100)) == pytest.approx(0.9)
    assert np.isnan(auc(scores, np.zeros_like(labels)))


@pytest.mark.parametrize(
    "candidate, champion, passed, reason",
    [
        ({"auc": 0.70, "ece": 0.02}, None, True, "no champion yet"),
        ({"auc": 0.70, "ece": 0.02}, {"auc": 0.702}, True, "within bounds"),
        ({"auc": 0.69, "ece": 0.02}, {"auc": 0.71}, False, "below the champion"),
        ({"auc": 0.75, "ece": 0.09}, {"auc": 0.71}, False, "ECE"),
        ({"auc": float("nan"), "ece": 0.01}, None, False, "undefined"),
    ],
)
def test_quality_gate(candidate, champion, passed, reason):
    decision = quality_gate(candidate, champion, GatePolicy())
    assert decision.passed is passed and any(reason in r for r in decision.reasons)


@pytest.mark.parametrize(
    "candidate, champion, passed, reason",
    [
        ({"rmse": 12.0, "mae": 9.0}, None, True, "no champion yet"),
        ({"rmse": 12.05, "mae": 9.0}, {"rmse": 12.0}, True, "within bounds"),  # 0.4 % worse: inside 1 %
        ({"rmse": 12.5, "mae": 9.0}, {"rmse": 12.0}, False, "above the champion"),
        ({"rmse": float("nan"), "mae": 9.0}, None, False, "undefined"),
    ],
)
def test_the_quality_gate_of_a_regression_model_judges_rmse(candidate, champion, passed, reason):
    decision = quality_gate(candidate, champion, GatePolicy(), task="regression")
    assert decision.passed is passed and any(reason in r for r in decision.reasons)
