"""A feature set's request features are traced when it is declared: a mistake fails at load naming the feature and
the column (issue 49: a comparison with text was accepted and failed later in lineage with an AttributeError)."""

from __future__ import annotations

import polars as pl
import pytest

from keel.features.spec import Entity, Feature, FeatureSet, FeatureSpecError, Label, RequestFeatures


def feature_set(compute) -> FeatureSet:
    rides = Entity(name="ride", source="validated_rides", id_column="ride_id", id_parts=("ride_ref",), date="day",
                   request_columns=("day", "kind", "km"), carried=("day",))  # fmt: skip
    return FeatureSet(rides, features=(Feature("flag", "int", 0, 1, 0, "1 for a long ride"),), label=Label("late", pl.col("late"), "binary"),
                      request=(RequestFeatures("ride", compute),))  # fmt: skip


def test_a_numeric_request_feature_is_accepted():
    fs = feature_set(lambda col, ops: {"flag": ops.as_int(col("km") > 3)})
    assert fs.column_sources()["flag"] == (("validated_rides", "km"),)


def test_a_comparison_with_text_fails_at_load_naming_the_column():
    with pytest.raises(FeatureSpecError, match=r"request features ride: compares kind with the text 'a'"):
        feature_set(lambda col, ops: {"flag": ops.as_int(col("kind") == "a")})
    with pytest.raises(FeatureSpecError, match="compares kind with the text"):
        feature_set(lambda col, ops: {"flag": ops.as_int(col("kind") != "a")})


def test_a_value_not_computed_from_the_request_fails_at_load():
    with pytest.raises(FeatureSpecError, match=r"request feature flag \(ride\) is a bool"):
        feature_set(lambda col, ops: {"flag": True})


def test_a_column_the_request_does_not_carry_fails_at_load():
    with pytest.raises(FeatureSpecError, match=r"request feature flag \(ride\) reads speed, not a request column"):
        feature_set(lambda col, ops: {"flag": ops.as_int(col("speed") > 3)})
