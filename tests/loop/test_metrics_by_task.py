"""The gate and the canary's realized quality judge a model by its task's loss: log-loss for a binary label,
squared error for a regression (keel/metrics.py)."""

from __future__ import annotations

import numpy as np
import pytest

from keel.exposures import arm_stats, exposure_frame
from keel.loop.gate import challenger_gate
from keel.metrics import per_row_loss, summary


def test_a_regression_challenger_is_gated_on_squared_error():
    rng = np.random.default_rng(11)
    y = rng.normal(100, 20, 5000)
    champion = y + rng.normal(0, 10, y.size)
    better = y + rng.normal(0, 5, y.size)
    v = challenger_gate(y, champion, better, task="regression")
    assert v.passed and v.loss == "squared_error" and "squared-error better" in v.reason
    assert v.champion_loss == pytest.approx(np.mean((champion - y) ** 2))
    meta = v.as_metadata()
    assert meta["champion_rmse"] == pytest.approx(np.sqrt(np.mean((champion - y) ** 2)))
    assert meta["challenger_mae"] == pytest.approx(np.mean(np.abs(better - y)))
    assert "champion_auc" not in meta
    worse = challenger_gate(y, better, champion, task="regression")
    assert not worse.passed and "not better" in worse.reason
    # the same numbers judged as probabilities would be nonsense: the task decides the loss
    with pytest.raises(ValueError, match="task must be one of"):
        challenger_gate(y, champion, better, task="ranking")


def test_summary_and_per_row_loss_by_task():
    y = np.array([0.0, 1.0, 1.0, 0.0])
    p = np.array([0.1, 0.8, 0.6, 0.3])
    assert summary("binary", p, y) == {"auc": 1.0, "log_loss": pytest.approx(np.mean(per_row_loss("binary", p, y)))}
    assert per_row_loss("regression", np.array([3.0]), np.array([1.0])).tolist() == [4.0]
    assert summary("regression", np.array([3.0, 1.0]), np.array([1.0, 1.0])) == {"rmse": np.sqrt(2.0), "mae": 1.0}


def test_the_canarys_realized_quality_uses_the_task_loss():
    rows = [
        {
            "ts": 1.0,
            "status": 200,
            "model_version": 2,
            "routed_version": 2,
            "latency_ms": 3.0,
            "score": s,
            "entity_key": k,
        }
        for k, s in (("a", 110.0), ("b", 90.0), ("c", 130.0))
    ]
    labels = {"a": 100.0, "b": 100.0, "c": 100.0}
    stats = arm_stats(exposure_frame(rows), 2, since=0, labels=labels, task="regression")
    assert stats.labelled == 3 and stats.log_loss == pytest.approx((100 + 100 + 900) / 3)
