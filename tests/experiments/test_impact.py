"""The impact predictor learns configuration → lift from a simulated history on real flights, predicts new
experiments with an interval, and is compared with their realized lift."""

from __future__ import annotations

import numpy as np
import pytest

from keel.experiments.impact import ImpactPredictor, compare, simulate_history
from resources import keel_resources
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from usecases.flights.experiments import flight_units


@pytest.fixture(scope="module")
def units(validated):  # noqa: F811
    return flight_units(validated["flights"])


def test_predictions_cover_the_realized_lift_and_beat_the_mean(units):
    history = simulate_history(units, 80, seed=1)
    predictor = ImpactPredictor.fit(history)
    new = simulate_history(units, 25, seed=2)  # experiments run after the model was trained
    predicted = predictor.predict(new)
    result = compare(predicted, new["realized_lift"])
    mean_error = float(np.median(np.abs(history["realized_lift"].mean() - new["realized_lift"].to_numpy())))
    print(f"impact predictor: {result}; always-the-mean error {mean_error:.3f}")
    assert result["coverage_80"] >= 0.6  # nominal 80 %, on 25 experiments
    assert result["median_abs_error"] < 0.6 * mean_error
    # stored as text and reloaded: the same predictions
    again = ImpactPredictor(dict(predictor.models), predictor.widen).predict(new)
    assert again["predicted_lift"].to_list() == predicted["predicted_lift"].to_list()
    assert all(m.startswith("tree") for m in predictor.models.values())


def test_stored_as_json_text_and_reloaded_exactly(units, tmp_path):
    from keel.experiments.impact import ImpactPredictor

    predictor = ImpactPredictor.fit(simulate_history(units, 40, seed=3))
    predictor.save(tmp_path / "p.json", note="test")
    raw = (tmp_path / "p.json").read_text()
    assert raw.lstrip().startswith("{") and "tree" in raw  # LightGBM text inside JSON, no pickle
    again = ImpactPredictor.load(tmp_path / "p.json")
    configs = simulate_history(units, 5, seed=4)
    assert (
        again.predict(configs)["predicted_lift"].to_list() == predictor.predict(configs)["predicted_lift"].to_list()
    )
    assert again.sha256 == predictor.sha256


def test_a_prediction_is_recorded_at_start_and_compared_with_the_realized_lift(units, validated, tmp_path,  # noqa: F811
                                                                              monkeypatch):  # fmt: skip
    """`keel experiment predict` and `start` predict from the spec's impact block with the trained predictor; the
    prediction made at the start is kept; experiment_analysis shows prediction against the realized lift."""
    import json
    import os
    import subprocess
    import sys

    import dagster as dg

    from assets.experiments import build_experiment_assets
    from keel.experiments import control
    from keel.experiments.impact import predictor_path, train_predictor, true_lift
    from keel.experiments.lake import wide_rows
    from keel.exposures import read_exposure_frame, realized_labels
    from tests import REPO
    from tests.experiments.test_control import SPEC, exposures_of_real_flights, open_store
    from usecases.flights import usecase as FLIGHTS
    from usecases.flights.features import FLIGHT_FEATURES

    experiment_exposures, experiment_wide_table, experiment_analysis = build_experiment_assets(FLIGHTS)[:3]
    home = tmp_path
    from keel.registry import ModelRegistry

    registry = ModelRegistry(home / "registry")
    for i in (1, 2):
        registry.register("flight-delay", f"model text {i}", {})
    registry.close()
    spec = home / "offer.yaml"
    lift = true_lift(0.15, 0)
    spec.write_text(SPEC.replace("ACTION", "pause").replace("LIFT", str(lift))
                    + "impact: {metric: accepted, discount: 0.15, target_late: false}\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CHAIN_KEY"} | {"KEEL_HOME": str(home)}
    cli = lambda *a: subprocess.run([sys.executable, "-m", "keel.cli", "experiment", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=REPO, env=env)  # fmt: skip
    missing = cli("predict", "--spec", str(spec))
    assert missing.returncode == 2 and "no impact predictor at" in missing.stderr
    predictor, check = train_predictor(units, history=60, held_out=10)
    predictor.save(predictor_path(home, "flight-delay"), check=check)
    out = cli("predict", "--spec", str(spec))
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    lo, hi = said["interval_80"]
    assert said["metric"] == "accepted" and lo <= said["predicted_lift"] <= hi
    assert said["config"] == {"discount": 0.15, "target_late": 0, "treatment_share": 0.5, "base_rate": 0.2}
    no_block = home / "plain.yaml"
    no_block.write_text(SPEC.replace("ACTION", "pause").replace("LIFT", "0"))
    bad = cli("predict", "--spec", str(no_block))
    assert bad.returncode == 2 and "spec.impact is missing" in bad.stderr

    started = cli("start", "--spec", str(spec))
    assert started.returncode == 0 and "predicted lift of accepted" in started.stdout, started.stdout + started.stderr
    store = open_store(home)
    meta = control.experiments(store)["rebooking-offer"]
    recorded = json.loads((home / "experiments" / "rebooking-offer" / "impact_prediction.json").read_text())
    assert recorded["predicted_lift"] == said["predicted_lift"] and recorded["started_at"] == meta["started_at"]

    exposures_of_real_flights(home, validated, meta["started_at"], offset=0.0, step=0.0)
    frame = read_exposure_frame(home / "serving" / "exposures")
    wide = wide_rows(frame, control.stored_spec(home, "rebooking-offer"), meta,
                     labels=realized_labels(FLIGHT_FEATURES, frame["entity_key"], home / "storage"))  # fmt: skip
    (home / "storage" / "flights" / "experiment_wide_table").mkdir(parents=True)
    wide.write_parquet(home / "storage" / "flights" / "experiment_wide_table" / "2026-01-01.parquet")
    control.stop(store, home, "rebooking-offer", author="ana", reason="done")
    store.close()
    monkeypatch.setenv("KEEL_HOME", str(home))
    result = dg.materialize(
        [experiment_exposures, experiment_wide_table, experiment_analysis],
        selection=[experiment_analysis],
        resources=keel_resources(home),
        raise_on_error=False,
    )
    assert result.success
    report = json.loads((home / "storage" / "flights" / "experiment_analysis" / "rebooking-offer.json").read_text())
    accepted = next(m for m in report["metrics"] if m["name"] == "accepted")
    impact = report["impact"]
    assert impact["predicted_lift"] == said["predicted_lift"] and impact["realized_lift"] == accepted["lift"]
    assert impact["inside_interval"] == (lo <= accepted["lift"] <= hi)
    [mat] = result.asset_materializations_for_node("flights__experiment_analysis")
    assert "impact: predicted" in mat.metadata["report"].value
