"""The declared column sources of the feature table (published as Dagster column lineage) match what the code does."""

import polars as pl

from keel.contracts.spec import load_contract
from tests import CONTRACTS
from usecases.flights.features import COLUMN_SOURCES, offline_features


def test_every_feature_table_column_declares_its_sources_and_they_exist(validated):
    feats = offline_features(validated["flights"], validated["weather"], validated["planes"], validated["flights"])
    assert list(COLUMN_SOURCES) == feats.columns  # same columns, same order
    inputs = {
        "validated_flights": {c.name for c in load_contract(CONTRACTS / "flights.yaml").columns},
        "validated_weather": {c.name for c in load_contract(CONTRACTS / "weather.yaml").columns},
        "raw_planes": set(validated["planes"].columns),
    }
    for column, sources in COLUMN_SOURCES.items():
        assert sources, column
        for dataset, source in sources:
            assert source in inputs[dataset], f"{column} ← {dataset}.{source}: no such input column"


def test_a_feature_changes_when_a_declared_source_changes_and_only_then(validated):
    """Perturb one input column; the feature columns that change must all declare it as a source."""
    flights, weather, planes = validated["flights"], validated["weather"], validated["planes"]
    base = offline_features(flights, weather, planes, flights)
    perturbed = {
        ("validated_weather", "wind_speed"): (flights, weather.with_columns(pl.col("wind_speed") + 3), planes),
        ("validated_flights", "distance"): (flights.with_columns(pl.col("distance") * 2), weather, planes),
        ("raw_planes", "seats"): (flights, weather, planes.with_columns(pl.lit("7").alias("seats"))),
        ("validated_flights", "air_time"): (flights.with_columns(pl.col("air_time") + 1), weather, planes),
    }
    for source, (f, w, p) in perturbed.items():
        out = offline_features(f, w, p, f)
        changed = {c for c in base.columns if not out[c].equals(base[c])}
        declared = {c for c, sources in COLUMN_SOURCES.items() if source in sources}
        assert changed <= declared, f"{source} changed {changed - declared} without declaring it"
        assert changed or not declared, f"{source} is declared a source but changed nothing"
