"""A KEEL_HOME with what explanations read: a champion trained on January's real features, and January–March
flight_features as the pipeline stores them."""

from __future__ import annotations

import polars as pl
import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from keel.data.nycflights import read_raw, read_raw_month
from keel.features.offline import offline_features
from keel.home import asset_file
from keel.registry import ModelRegistry
from keel.storage import write_parquet_atomic
from keel.training.model import TrainingConfig, train_model
from tests.conftest import CONTRACTS

MODEL = "flight-delay"
MONTHS = ("2013-01", "2013-02", "2013-03")


@pytest.fixture(scope="session")
def features():
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    valid = {}
    for table in ("flights", "weather"):
        compiled = CompiledContract(load_contract(CONTRACTS / f"{table}.yaml"))
        valid[table] = pl.concat([compiled.validate(read_raw_month(table, m), references=refs).valid for m in MONTHS])
    return offline_features(valid["flights"], valid["weather"], read_raw("planes"), valid["flights"])


@pytest.fixture(scope="session")
def explained_home(tmp_path_factory, features):
    home = tmp_path_factory.mktemp("explain_home")
    text = train_model(features, TrainingConfig(train_months=("2013-01",), valid_month="2013-02")).text
    with ModelRegistry(home / "registry") as registry:
        sha = registry.register(MODEL, text, {"note": "explain test model"}).sha256
        registry.promote(MODEL, sha, "test")
    for month in MONTHS:
        part = features.filter(pl.col("sched_date").dt.strftime("%Y-%m") == month)
        write_parquet_atomic(part, asset_file(home / "storage", ["flight_features"], month))
    return home, text
