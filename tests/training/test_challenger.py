"""The loop's challenger, materialized as the drift sensor's run does it: trained on the plan's months of stored
features, registered with what asked for it, and gated against the champion on the gate month — the verdict the
asset records is the one the gate gives on the same models and flights."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from assets.loop import CHALLENGER_GATE
from keel.home import KeelHome
from keel.loop.gate import challenger_gate
from keel.registry import ModelRegistry
from keel.storage import write_parquet_atomic
from keel.training.model import TrainingConfig, month_of, predict, train_model
from resources import keel_resources
from tests.flights import challenger_evaluation, challenger_model
from usecases.flights.features import FLIGHT_FEATURES

MONTHS = ("2013-01", "2013-02", "2013-03", "2013-04", "2013-05")


@pytest.fixture
def home(tmp_path, feature_months):
    """Stored flight_features for 2013-01…05 (as the pipeline writes them) and a champion trained on January."""
    home = KeelHome.of(tmp_path)
    for m in MONTHS:
        write_parquet_atomic(
            month_of(feature_months, m, FLIGHT_FEATURES), home.asset_file("flights/flight_features", m)
        )
    first = train_model(
        feature_months, TrainingConfig(train_months=("2013-01",), valid_month="2013-02"), FLIGHT_FEATURES
    )
    with ModelRegistry(home.registry) as reg:
        reg.register("flight-delay", first.text, {"train_months": ["2013-01"], "valid_month": "2013-02"})
        reg.set_alias("flight-delay", "champion", first.sha256, "test: the first model")
    return home


def run(home, config: dict, instance=None):
    return dg.materialize(
        [challenger_model, challenger_evaluation],
        resources=keel_resources(home.root),
        run_config={
            "ops": {
                "flights__challenger_model": {"config": config},
                "flights__challenger_evaluation": {"config": config},
            }
        },
        instance=instance,
        raise_on_error=False,
    )


def test_the_challenger_is_trained_on_the_plan_and_gated_on_the_month_after(home):
    config = {"train_months": ["2013-02", "2013-03", "2013-04"], "gate_month": "2013-05", "gate_from_day": 22,
              "drift_window": "2013-05", "drift_event": 7}  # fmt: skip
    result = run(home, config)
    assert result.success
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    model, evaluation = mats["challenger_model"], mats["challenger_evaluation"]
    assert (model["fitted_on"].value, model["early_stopped_on"].value) == (
        "2013-02, 2013-03, 2013-04",
        "2013-05 days 1–21",
    )
    with ModelRegistry(home.registry) as reg:
        sha = model["sha256"].value
        meta = reg.get("flight-delay", sha).metadata
        assert reg.alias("flight-delay", "challenger") == sha and reg.version("flight-delay", sha) == 2
        assert meta["train_months"] == ["2013-02", "2013-03", "2013-04"] and meta["valid_month"] == "2013-05"
        assert meta["valid_days"] == [1, 21] and meta["gate_from_day"] == 22
        assert meta["trigger"] == {"drift_window": "2013-05", "drift_event": 7} and meta["run_id"] == result.run_id
        # the recorded verdict is the gate's on the same models and the gate month's flights it did not see
        gate_flights = pl.read_parquet(home.asset_file("flights/flight_features", "2013-05")).filter(
            pl.col("sched_date").dt.day() >= 22
        )
        champion_scores, labels = predict(
            reg.load(reg.alias("flight-delay", "champion")), gate_flights, FLIGHT_FEATURES
        )
        challenger_scores, _ = predict(reg.load(sha), gate_flights, FLIGHT_FEATURES)
    verdict = challenger_gate(labels, champion_scores, challenger_scores)
    assert evaluation["passed"].value == verdict.passed and evaluation["reason"].value == verdict.reason
    assert evaluation["rows"].value == verdict.rows == gate_flights[
        "label_late15"
    ].is_not_null().sum()  # fmt: skip
    assert (evaluation["challenger_version"].value, evaluation["champion_version"].value) == (2, 1)
    assert meta["challenger_gate"]["passed"] == verdict.passed and meta["challenger_gate"]["gate_month"] == "2013-05"
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == CHALLENGER_GATE and check.passed == verdict.passed


@pytest.mark.parametrize(
    "config, message",
    [
        ({"train_months": ["2013-03", "2013-04"], "gate_month": "2013-04"}, "is in the training window"),
        ({"train_months": [], "gate_month": "2013-05"}, "train_months is empty"),
        ({"train_months": ["2013-03", "2013-04"], "gate_month": "2013-05", "gate_from_day": 40}, "must be 2…28"),
        ({"train_months": ["2013-05", "2013-06"], "gate_month": "2013-07"}, "no stored partition for 2013-06"),
    ],
)
def test_a_plan_that_cannot_be_honoured_fails_and_says_why(home, config, message):
    result = run(home, config)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert message in str(failure.event_specific_data.error)
    with ModelRegistry(home.registry) as reg:
        assert reg.versions("flight-delay") == [1]  # nothing registered
