"""Freezing on evidence, with a real LightGBM model: a feature whose served values went wrong is better frozen; a
feature whose values moved with the world (the model still reads them right) is better live."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import polars as pl

from keel.loop.freeze import DEFAULT_FREEZE, freeze_evidence
from keel.training.model import TrainingConfig, train_model
from usecases.flights.features import FEATURE_NAMES, FLIGHT_FEATURES, LABEL

NOW = datetime(2013, 7, 2, 12, tzinfo=UTC)


def month(first: date, n: int, seed: int, shift: float = 0.0, served_offset: float = 0.0) -> pl.DataFrame:
    """Flights whose lateness depends on the route's delay rate (x); ``shift`` moves the world's x (lateness moves
    with it), ``served_offset`` breaks what is served (lateness does not move)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.2 + shift, 0.08, n)
    late = rng.random(n) < 1 / (1 + np.exp(-(x - 0.2) * 25))
    cols = {name: rng.normal(0.0, 1.0, n) for name in FEATURE_NAMES}
    cols["route_delay_rate"] = x + served_offset
    return pl.DataFrame(
        cols
        | {
            "flight_id": [f"{first:%Y%m}-{i:06d}" for i in range(n)],
            "sched_date": [first + timedelta(days=i % 28) for i in range(n)],
            LABEL: late.astype(np.int8),
        }
    )


def model_text() -> str:
    history = pl.concat([month(date(2013, 1, 1), 4000, 1), month(date(2013, 2, 1), 2000, 2)])
    return train_model(
        history, TrainingConfig(train_months=("2013-01",), valid_month="2013-02"), FLIGHT_FEATURES
    ).text


def test_a_broken_feature_is_better_frozen_and_the_freeze_expires():
    broken = month(date(2013, 6, 1), 3000, 3, served_offset=0.3)  # served +0.3 off: every flight looks late
    d = freeze_evidence(model_text(), broken, "route_delay_rate", 0.2, "2013-06", NOW, FLIGHT_FEATURES)
    assert d.freeze, d.reason
    assert d.frozen_log_loss < d.live_log_loss
    assert d.expires_at == NOW + DEFAULT_FREEZE.expiry and "2013-06" in d.reason


def test_a_feature_that_moved_with_the_world_stays_live():
    moved = month(date(2013, 6, 1), 3000, 4, shift=0.05)  # more delay, and the model reads it right
    d = freeze_evidence(model_text(), moved, "route_delay_rate", 0.2, "2013-06", NOW, FLIGHT_FEATURES)
    assert not d.freeze and d.expires_at is None
    assert d.live_log_loss < d.frozen_log_loss and "not better" in d.reason


def test_no_reference_value_no_freeze():
    d = freeze_evidence(
        "unused", month(date(2013, 6, 1), 10, 5), "route_delay_rate", None, "2013-06", NOW, FLIGHT_FEATURES
    )
    assert not d.freeze and "no reference value" in d.reason
