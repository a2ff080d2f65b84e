"""A KEEL_HOME with what explanations read: a champion trained on January's real features, and January–March
flight_features as the pipeline stores them."""

from __future__ import annotations

import polars as pl
import pytest

from keel.home import asset_file
from keel.registry import ModelRegistry
from keel.storage import write_parquet_atomic
from keel.training.model import TrainingConfig, train_model
from tests.features.conftest import validated_months
from usecases.flights.features import FLIGHT_FEATURES, offline_features

MODEL = "flight-delay"
MONTHS = ("2013-01", "2013-02", "2013-03")


@pytest.fixture(scope="session")
def features():
    valid = validated_months(MONTHS)
    return offline_features(valid["flights"], valid["weather"], valid["planes"], valid["flights"])


@pytest.fixture(scope="session")
def explained_home(tmp_path_factory, features):
    home = tmp_path_factory.mktemp("explain_home")
    text = train_model(
        features, TrainingConfig(train_months=("2013-01",), valid_month="2013-02"), FLIGHT_FEATURES
    ).text
    with ModelRegistry(home / "registry") as registry:
        sha = registry.register(MODEL, text, {"note": "explain test model"}).sha256
        registry.promote(MODEL, sha, "test")
    for month in MONTHS:
        part = features.filter(pl.col("sched_date").dt.strftime("%Y-%m") == month)
        write_parquet_atomic(part, asset_file(home / "storage", ["flights", "flight_features"], month))
    return home, text
