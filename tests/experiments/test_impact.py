"""The impact predictor learns configuration → lift from a simulated history on real flights, predicts new
experiments with an interval, and is compared with their realized lift."""

from __future__ import annotations

import numpy as np
import pytest

from keel.experiments.impact import ImpactPredictor, compare, simulate_history
from keel.experiments.simulator import flight_units
from tests.features.conftest import validated  # noqa: F401 - shared session fixture


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
