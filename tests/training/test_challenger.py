"""The loop's challenger, materialized as the drift sensor's run does it: trained on the plan's months of stored
features — several candidates, each registered with what asked for it — and gated against the champion on the gate
month's later days: the choice the asset records is ``choose_candidate``'s on the same models and flights."""

from __future__ import annotations

import dataclasses

import dagster as dg
import lightgbm as lgb
import polars as pl
import pytest

from assets.challengers import CHALLENGER_GATE, ChallengerConfig
from assets.models import training_config
from keel.home import KeelHome
from keel.loop.candidates import CandidateSpec, choose_candidate
from keel.loop.fit import candidate_training, committee_members
from keel.loop.shadow import ShadowPolicy
from keel.registry import ModelRegistry
from keel.storage import write_parquet_atomic
from keel.training.model import TrainingConfig, month_of, predict, train_model
from resources import keel_resources
from tests.flights import challenger_evaluation, challenger_model
from usecases.flights import usecase as flights
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
        reg.register(
            "flight-delay",
            first.text,
            {
                "train_months": ["2013-01"],
                "valid_month": "2013-02",
                "training_code_version": "test: as the model asset records",
            },
        )
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


def test_the_candidates_are_trained_on_their_windows_and_the_gate_chooses_among_them(home):
    config = {"train_months": ["2013-02", "2013-03", "2013-04"], "gate_month": "2013-05", "gate_from_day": 22,
              "drift_window": "2013-05", "drift_event": 7, "label_drift": True}  # fmt: skip
    result = run(home, config)
    assert result.success
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    model, evaluation = mats["challenger_model"], mats["challenger_evaluation"]
    assert model["early_stopped_on"].value == "2013-05 days 1–21" and model["label_drift"].value is True
    trained = {r.data["candidate"]: r.data["version"] for r in model["candidates"].value.records}
    assert trained == {"rolling": 2, "expanding": 3, "recency": 4, "committee": 5, "recalibrated": 6}
    gate_flights = pl.read_parquet(home.asset_file("flights/flight_features", "2013-05")).filter(
        pl.col("sched_date").dt.day() >= 22
    )
    with ModelRegistry(home.registry) as reg:
        meta = {
            c: reg.get("flight-delay", reg.sha_of_version("flight-delay", v)).metadata for c, v in trained.items()
        }
        assert meta["rolling"]["train_months"] == ["2013-02", "2013-03", "2013-04"]
        assert meta["expanding"]["train_months"] == ["2013-01", "2013-02", "2013-03", "2013-04"]  # all history
        assert meta["recency"]["half_life_days"] == 60.0 and meta["recency"]["train_months"][0] == "2013-01"
        for c in ("rolling", "expanding", "recency"):
            assert meta[c]["valid_month"] == "2013-05" and meta[c]["valid_days"] == [1, 21]
            assert meta[c]["trigger"] == {"drift_window": "2013-05", "drift_event": 7}
            assert meta[c]["run_id"] == result.run_id and meta[c]["candidate"] == c
        # the recalibrated candidate is the champion's trees, its raw score moved by the fitted map
        recal = meta["recalibrated"]["recalibration"]
        assert recal["of_version"] == 1 and recal["method"] == "platt" and recal["fitted_on"] == "2013-05 days 1–21"
        champion_text = reg.load(reg.alias("flight-delay", "champion"))
        x = gate_flights.select([pl.col(n).cast(pl.Float64) for n in FLIGHT_FEATURES.names]).to_numpy()[:50]
        raw = lgb.Booster(model_str=champion_text).predict(x, raw_score=True)
        moved = lgb.Booster(model_str=reg.load(reg.sha_of_version("flight-delay", 6))).predict(x, raw_score=True)
        assert moved == pytest.approx(recal["a"] * raw + recal["b"], abs=1e-6)
        # the committee: the first model (v1) and this decision's expanding refit (v3), their raw scores averaged
        assert [(m["role"], m["version"]) for m in meta["committee"]["committee"]] == [
            ("first model", 1), ("this decision's expanding refit", 3)]  # fmt: skip
        mean = lgb.Booster(model_str=reg.load(reg.sha_of_version("flight-delay", 5))).predict(x, raw_score=True)
        expanding = lgb.Booster(model_str=reg.load(reg.sha_of_version("flight-delay", 3))).predict(x, raw_score=True)
        assert mean == pytest.approx((raw + expanding) / 2, abs=1e-9)
        assert meta["expanding"]["window"] == "expanding" and meta["rolling"]["window"] is None
        # the recorded choice is choose_candidate's on the same models and the gate days' flights none of them saw
        champion_scores, labels = predict(champion_text, gate_flights, FLIGHT_FEATURES)
        scores = {c: predict(reg.load(reg.sha_of_version("flight-delay", v)), gate_flights, FLIGHT_FEATURES)[0]
                  for c, v in trained.items()}  # fmt: skip
        days = gate_flights.filter(pl.col("label_late15").is_not_null()).sort("flight_id")["sched_date"].to_numpy()
        choice = choose_candidate(labels, champion_scores, scores, days,
                                  ShadowPolicy(margin=0.001, min_labelled=1000, min_clusters=5))  # fmt: skip
        table = {r.data["candidate"]: r.data for r in evaluation["candidates"].value.records}
        assert set(table) == set(trained) and evaluation["passed"].value == (choice.chosen is not None)
        assert evaluation["reason"].value == choice.reason
        for row in choice.rows:
            assert table[row.name]["delta"] == pytest.approx(row.verdict.delta, abs=1e-6)
            assert table[row.name]["days"] == len(set(days)) and table[row.name]["chosen"] == row.chosen
        shown = evaluation["candidate"].value
        # the challenger alias names the chosen candidate, and only one the gate chose (a refused one is not served)
        challenger = reg.alias("flight-delay", "challenger")
        if choice.chosen is None:
            assert challenger not in {reg.sha_of_version("flight-delay", v) for v in trained.values()}
        else:
            assert challenger == reg.sha_of_version("flight-delay", trained[shown])
        assert evaluation["challenger_version"].value == trained[shown] and evaluation["champion_version"].value == 1
        assert meta[shown]["run_id"] == result.run_id
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == CHALLENGER_GATE and check.passed == (choice.chosen is not None)


def test_without_label_drift_no_recalibration_is_trained_and_the_next_committee_keeps_this_refit(home):
    config = {"train_months": ["2013-01", "2013-02", "2013-03"], "gate_month": "2013-04", "gate_from_day": 22}
    result = run(home, config)
    assert result.success
    [model] = [e.materialization.metadata for e in result.get_asset_materialization_events()
               if e.asset_key.path[-1] == "challenger_model"]  # fmt: skip
    # the rolling window is all the history there is: no separate expanding candidate, the rolling one is the refit
    assert [(r.data["candidate"], r.data["version"]) for r in model["candidates"].value.records] == [
        ("rolling", 2), ("recency", 3), ("committee", 4)]  # fmt: skip
    # the next decision's committee: the first model, this decision's refit (v2) and the next one's expanding refit
    result = run(home, {"train_months": ["2013-02", "2013-03", "2013-04"], "gate_month": "2013-05"})
    assert result.success
    with ModelRegistry(home.registry) as reg:
        versions = {reg.get("flight-delay", reg.sha_of_version("flight-delay", v)).metadata["candidate"]: v
                    for v in reg.versions("flight-delay")[4:]}  # fmt: skip
        committee = reg.get("flight-delay", reg.sha_of_version("flight-delay", versions["committee"])).metadata
        assert [(m["role"], m["version"]) for m in committee["committee"]] == [
            ("first model", 1), ("previous expanding refit", 2),
            ("this decision's expanding refit", versions["expanding"])]  # fmt: skip
        # a use case whose committee leaves the previous refit out (hotels: Loop.committee_previous=False)
        assert committee_members(reg, "flight-delay", "2013-06", previous=False) == [
            ("first model", reg.sha_of_version("flight-delay", 1))]  # fmt: skip


def test_a_candidate_early_stops_with_the_patience_its_use_case_declares(feature_months):
    """Twenty rounds without improvement end the fit at the first local minimum of the validation loss; a use case
    with a small, noisy gate month (hotels) looks at every round and keeps the best — never fewer trees."""
    spec = CandidateSpec("expanding", ("2013-01", "2013-02", "2013-03"), expanding=True)
    config = ChallengerConfig(train_months=["2013-01", "2013-02", "2013-03"], gate_month="2013-04")
    patient = dataclasses.replace(flights, loop=dataclasses.replace(flights.loop, early_stopping_rounds=200))
    fits = {}
    for uc in (flights, patient):
        training = candidate_training(spec, config, training_config(uc).params, uc)
        assert training.early_stopping_rounds == uc.loop.early_stopping_rounds
        assert training.valid_month == "2013-04" and training.valid_days == (1, 21)
        fits[uc.loop.early_stopping_rounds] = train_model(feature_months, training, FLIGHT_FEATURES).best_iteration
    assert fits[200] >= fits[20] and 1 <= fits[200] <= 200


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


def test_a_gate_a_fault_switch_passed_says_so_on_its_materialization(home, monkeypatch):
    """Issue 61 item 4: ``KEEL_FAULT_GATE=always-pass`` (allowed: the home is a test home) shows on the gate's
    materialization as ``fault_injected``, and the gate passed whatever its evidence said."""
    monkeypatch.setenv("KEEL_HOME", str(home.root))
    monkeypatch.setenv("KEEL_FAULT_GATE", "always-pass")
    config = {
        "train_months": ["2013-02", "2013-03", "2013-04"],
        "gate_month": "2013-05",
        "gate_from_day": 22,
        "drift_window": "2013-05",
        "drift_event": 7,
        "label_drift": False,
    }
    result = run(home, config)
    assert result.success
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    evaluation = mats["challenger_evaluation"]
    assert evaluation["passed"].value is True
    assert evaluation["fault_injected"].value.startswith("KEEL_FAULT_GATE=always-pass: the challenger gate passes")


def test_the_robust_candidate_is_fitted_to_the_median_and_the_use_cases_own_recipe_is_untouched():
    """Hotels' ``robust`` candidate: the expanding window with LightGBM's absolute-error loss in place of the use
    case's squared error — in what it trains with, in the model text it registers and serves."""
    from keel.features.offline import offline_features
    from keel.loop.candidates import candidate_specs
    from usecases.hotels import replay
    from usecases.hotels import usecase as hotels

    train = ("2016-07", "2016-08", "2016-09")
    config = ChallengerConfig(train_months=list(train), gate_month="2016-10", gate_from_day=15)
    specs = {s.name: s for s in candidate_specs(train, hotels.months, False, hotels.loop.candidates)}
    assert set(specs) == {"expanding", "robust"}
    valid = replay.valid_bookings()
    features = offline_features(hotels.features, valid, {}, valid)
    fitted = {}
    for name, spec in specs.items():
        training = candidate_training(spec, config, hotels.model.params, hotels)
        assert training.train_months == train and training.valid_days == (1, 14)
        fitted[name] = train_model(features, training, hotels.features).text
    assert hotels.model.params["objective"] == "regression"  # the use case's recipe is not changed by the candidate
    assert "objective=regression\n" in fitted["expanding"] and "objective=regression_l1\n" in fitted["robust"]
