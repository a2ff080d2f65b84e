"""drift_report judges a month against what the serving model was trained on: the initial reference while the
champion is the January–March model, the champion's own training months once a retrained model is promoted."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from keel.drift import build_reference
from keel.registry import ModelRegistry
from keel.storage import write_parquet_atomic
from resources import keel_resources
from tests.flights import MONITORED_CATEGORICAL, MONITORED_NUMERIC, REFERENCE_MONTHS, drift_report


def month_frame(seed: int, temp_mean: float, n: int = 3000) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    cols = {name: rng.normal(0.3, 0.05, n) for name in MONITORED_NUMERIC}
    cols["temp"] = rng.normal(temp_mean, 8.0, n)
    cols |= {c: rng.choice(["AA", "B6", "UA"], n) for c in MONITORED_CATEGORICAL}
    return pl.DataFrame(cols)


def run_report(home, month: str, features: pl.DataFrame, reference: pl.DataFrame):
    import dagster as dg

    resources = keel_resources(home)
    context = dg.build_asset_context(partition_key=month, resources=resources)
    events = list(drift_report(context, features=features, reference=reference))
    [out] = [e for e in events if isinstance(e, dg.Output)]
    checks = {e.check_name: e for e in events if isinstance(e, dg.AssetCheckResult)}
    return out, checks


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    return tmp_path


def test_summer_is_not_drift_once_the_champion_was_trained_on_summer(home):
    winter = build_reference(
        month_frame(1, 35.0), window="2013-01..2013-03", numeric=MONITORED_NUMERIC, categorical=MONITORED_CATEGORICAL
    ).to_frame()
    july = month_frame(2, 80.0)
    # the January–March champion (no registry entry yet): July's temperature has drifted
    out, checks = run_report(home, "2013-07", july, winter)
    assert "temp" in out.metadata["drifted_features"].value and not checks["drift_temp"].passed
    # a champion trained on April–June (its months' features on disk): July is judged against early summer
    for i, month in enumerate(("2013-04", "2013-05", "2013-06")):
        write_parquet_atomic(
            month_frame(10 + i, 76.0 + 2 * i), home / "storage" / "flights" / "flight_features" / f"{month}.parquet"
        )
    registry = ModelRegistry(home / "registry")
    sha = registry.register(
        "flight-delay", "tree\nsummer\n", {"train_months": ["2013-04", "2013-05", "2013-06"]}
    ).sha256
    registry.set_alias("flight-delay", "champion", sha, "test: promoted")
    registry.close()
    out, checks = run_report(home, "2013-07", july, winter)
    assert "temp" not in out.metadata["drifted_features"].value and checks["drift_temp"].passed
    assert tuple(REFERENCE_MONTHS) == ("2013-01", "2013-02", "2013-03")


def test_a_champion_whose_months_are_missing_is_a_clear_failure(home):
    import dagster as dg

    registry = ModelRegistry(home / "registry")
    sha = registry.register("flight-delay", "tree\nx\n", {"train_months": ["2013-08", "2013-09", "2013-10"]}).sha256
    registry.set_alias("flight-delay", "champion", sha, "test")
    registry.close()
    with pytest.raises(dg.Failure, match="2013-08..2013-10.*materialize those months first"):
        run_report(home, "2013-11", month_frame(3, 50.0), month_frame(4, 35.0))
