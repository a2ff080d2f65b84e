"""Recalibration as a candidate (keel/loop/recalibrate.py): the affine map fitted to the newest labels, written into
the champion's own trees."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest

from keel.chaos import invert_model
from keel.loop.recalibrate import affine_model_text, fit_recalibration


@pytest.fixture(scope="module")
def booster_and_x():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 4))
    y = (rng.uniform(size=4000) < 1 / (1 + np.exp(-(x[:, 0] - 0.5 * x[:, 1])))).astype(float)
    params = {"objective": "binary", "num_leaves": 7, "verbose": -1, "seed": 1, "deterministic": True,
              "num_threads": 1}  # fmt: skip
    return lgb.train(params, lgb.Dataset(x, y), num_boost_round=30), x


def test_the_rewritten_model_scores_the_affine_map_of_the_raw_score(booster_and_x):
    booster, x = booster_and_x
    raw = booster.predict(x, raw_score=True)
    moved = lgb.Booster(model_str=affine_model_text(booster.model_to_string(), 0.6, -0.4))
    np.testing.assert_allclose(moved.predict(x, raw_score=True), 0.6 * raw - 0.4, rtol=0, atol=1e-9)
    np.testing.assert_allclose(moved.predict(x), 1 / (1 + np.exp(-(0.6 * raw - 0.4))), rtol=0, atol=1e-9)
    # the chaos drill's inverted challenger is the same map with a = −1
    inverted = lgb.Booster(model_str=invert_model(booster.model_to_string()))
    np.testing.assert_allclose(inverted.predict(x), 1 - booster.predict(x), rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    ("task", "method", "truth"),
    [
        ("binary", "intercept", (1.0, 0.7)),  # the base rate rose: every log-odds +0.7
        ("binary", "platt", (0.5, -0.3)),  # overconfident and too high
        ("regression", "bias", (1.0, 12.0)),  # prices moved up by 12
    ],
)
def test_the_fit_recovers_the_drift_and_lowers_the_loss(task, method, truth):
    rng = np.random.default_rng(4)
    raw = rng.normal(0, 1.5, 40_000) if task == "binary" else rng.uniform(50, 250, 40_000)
    a, b = truth
    if task == "binary":
        y = (rng.uniform(size=raw.size) < 1 / (1 + np.exp(-(a * raw + b)))).astype(float)
    else:
        y = raw + b + rng.normal(0, 20, raw.size)
    fit = fit_recalibration(task, raw, y, method)
    assert fit.a == pytest.approx(a, abs=0.05) and fit.b == pytest.approx(b, abs=0.05 if task == "binary" else 0.5)
    assert fit.loss_after < fit.loss_before and method in fit.describe()


def test_a_method_that_does_not_fit_the_task_is_refused():
    with pytest.raises(ValueError, match="method must be one of"):
        fit_recalibration("regression", np.zeros(3), np.zeros(3), "platt")
    with pytest.raises(ValueError, match="no leaf_value lines"):
        affine_model_text("not a model", 1.0, 0.0)
