"""The coarse fallback model (keel/training/coarse.py): small, deterministic, judged against the constant a caller
could know without a model, registered beside the main model and linked from it only when it beats that constant."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import polars as pl
import pytest

from keel.registry import ModelRegistry, coarse_name
from keel.training.coarse import fit_coarse, train_coarse
from keel.training.model import TrainingConfig, train_model
from keel.usecase import Coarse, ModelSpec, UseCaseError
from usecases.flights.features import FLIGHT_FEATURES

CONFIG = TrainingConfig(train_months=("2013-01", "2013-02"), valid_month="2013-03")


def test_the_coarse_model_is_small_deterministic_and_beats_the_delay_rate(feature_months):
    coarse = train_coarse(feature_months, CONFIG, FLIGHT_FEATURES, Coarse(num_leaves=7, rounds=40))
    booster = lgb.Booster(model_str=coarse.text)
    assert booster.num_trees() <= 40
    assert max(t["num_leaves"] for t in booster.dump_model()["tree_info"]) <= 7
    labels = feature_months.filter(pl.col("sched_date").dt.strftime("%Y-%m").is_in(["2013-01", "2013-02"]))
    assert coarse.constant == pytest.approx(float(labels[FLIGHT_FEATURES.label.column].drop_nulls().mean()))
    assert coarse.loss == "log_loss" and coarse.rows > 10_000
    assert coarse.passed and coarse.coarse_loss < coarse.constant_loss, coarse.verdict()
    assert train_coarse(feature_months, CONFIG, FLIGHT_FEATURES, Coarse()).sha256 == coarse.sha256


def test_a_coarse_model_that_does_not_beat_the_constant_is_not_linked(tmp_path, feature_months):
    """Labels shuffled: no feature says anything about them, so the coarse model cannot beat their mean; it is
    registered (what was tried is kept) but not linked, and an earlier link of the same main model is removed."""
    label = FLIGHT_FEATURES.label.column
    shuffled = feature_months.with_columns(
        pl.Series(label, np.random.default_rng(0).permutation(feature_months[label].to_numpy()))
    )
    main = train_model(feature_months, CONFIG, FLIGHT_FEATURES)
    with ModelRegistry(tmp_path / "registry") as reg:
        reg.register("flight-delay", main.text, {})
        good, version = fit_coarse(
            reg, "flight-delay", Coarse(), feature_months, CONFIG, FLIGHT_FEATURES, main.sha256, {}
        )
        assert good.passed and version == 1
        assert reg.get("flight-delay", main.sha256).metadata["coarse_sha256"] == good.sha256
        bad, version = fit_coarse(reg, "flight-delay", Coarse(), shuffled, CONFIG, FLIGHT_FEATURES, main.sha256, {})
        assert not bad.passed and version is None, bad.verdict()
        assert "does not beat" in bad.verdict()
        assert reg.get("flight-delay", main.sha256).metadata["coarse_sha256"] is None
        assert reg.get(coarse_name("flight-delay"), bad.sha256).metadata["gate"]["passed"] is False
        assert fit_coarse(reg, "flight-delay", None, feature_months, CONFIG, FLIGHT_FEATURES, main.sha256, {}) is None


def test_a_declaration_says_what_is_wrong_with_its_coarse_model():
    with pytest.raises(UseCaseError, match="num_leaves must be 2…31"):
        Coarse(num_leaves=64)
    with pytest.raises(UseCaseError, match="coarse model's name"):
        ModelSpec(name="m" * 60, coarse=Coarse())
