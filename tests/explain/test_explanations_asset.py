"""The ``explanations`` asset on real months: mean |TreeSHAP| per feature and segment, recomputed here; the shift
check against the reference window; the plots."""

from __future__ import annotations

import dagster as dg
import lightgbm as lgb
import numpy as np
import polars as pl
import pytest

from assets.explanations import ATTRIBUTION_SHIFT, build_explanation_assets
from assets.usecase import wiring
from keel.explanations import (
    SAMPLE_ROWS,
    SHIFT_THRESHOLD,
    attribution_shift,
    attribution_summary,
    explanation_sample,
    feature_matrix,
)
from resources import keel_resources
from usecases.flights import usecase as FLIGHTS
from usecases.flights.features import FEATURE_NAMES, FLIGHT_FEATURES

FS = FLIGHT_FEATURES
[explanations] = build_explanation_assets(FLIGHTS)
STORED_FEATURES = dg.AssetSpec(
    ["flights", "flight_features"], partitions_def=wiring(FLIGHTS).monthly
)  # read from the files written


def materialize(home, month):
    return dg.materialize(
        [STORED_FEATURES, explanations], selection=[explanations.key], partition_key=month,
        resources=keel_resources(home), raise_on_error=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def february(explained_home):
    home, _ = explained_home
    materialize(home, "2013-01")  # so February's trend plot has a month before it
    return materialize(home, "2013-02")


def test_mean_absolute_contributions_per_feature_and_segment(february, explained_home, features):
    home, text = explained_home
    assert february.success
    summary = february.output_for_node("flights__explanations")
    feb = explanation_sample(features.filter(pl.col("sched_date").dt.strftime("%Y-%m") == "2013-02"), FS, seed=201302)
    assert feb.height == SAMPLE_ROWS
    contrib = lgb.Booster(model_str=text).predict(feature_matrix(feb, FS), pred_contrib=True)[:, :-1]
    overall = summary.filter(pl.col("segment") == "all")
    got = dict(zip(overall["feature"], overall["mean_abs"], strict=True))
    np.testing.assert_allclose([got[f] for f in FEATURE_NAMES], np.abs(contrib).mean(axis=0), rtol=1e-9)
    assert overall["share"].sum() == pytest.approx(1.0) and set(overall["rows"]) == {feb.height}
    ua = summary.filter((pl.col("segment") == "carrier") & (pl.col("value") == "UA"))
    mask = (feb["carrier"] == "UA").to_numpy()
    ua_temp = ua.filter(pl.col("feature") == "temp")["mean_abs"][0]
    assert ua_temp == pytest.approx(np.abs(contrib[mask, FEATURE_NAMES.index("temp")]).mean(), rel=1e-9)
    assert set(summary.filter(pl.col("segment") == "origin")["value"]) == {"EWR", "JFK", "LGA"}


def test_the_shift_check_judges_the_month_against_the_reference_window(february, explained_home, features):
    _, text = explained_home
    booster = lgb.Booster(model_str=text)
    feb = explanation_sample(features.filter(pl.col("sched_date").dt.strftime("%Y-%m") == "2013-02"), FS, seed=201302)
    ref = explanation_sample(features, FS, seed=20130103)  # January–March: the reference window
    shifts = attribution_shift(
        attribution_summary(feb, booster.predict(feature_matrix(feb, FS), pred_contrib=True), (), FS.names),
        attribution_summary(ref, booster.predict(feature_matrix(ref, FS), pred_contrib=True), (), FS.names),
    )
    [check] = february.get_asset_check_evaluations()
    assert check.check_name == ATTRIBUTION_SHIFT
    assert check.passed == (max(abs(s.moved) for s in shifts) <= SHIFT_THRESHOLD)
    assert check.metadata["largest_move"].value == shifts[0].feature
    meta = february.asset_materializations_for_node("flights__explanations")[0].metadata
    assert meta["model_version"].value == 1 and meta["plot"].value.count("data:image/svg+xml;base64,") == 2
    assert sum(meta[f"share_{f}"].value for f in FEATURE_NAMES) == pytest.approx(1.0, abs=1e-3)


def test_a_sharp_change_in_what_drives_the_predictions_is_flagged():
    def summary(shares):
        return pl.DataFrame({"segment": "all", "value": "all", "rows": 1, "feature": list(FEATURE_NAMES),
                             "mean_abs": shares, "share": shares})  # fmt: skip

    even = [1 / len(FEATURE_NAMES)] * len(FEATURE_NAMES)
    temp_driven = [0.5 if f == "temp" else 0.5 / (len(FEATURE_NAMES) - 1) for f in FEATURE_NAMES]
    shifts = attribution_shift(summary(temp_driven), summary(even))
    assert shifts[0].feature == "temp" and shifts[0].flagged
    assert [s.feature for s in shifts if s.flagged] == ["temp"]
    assert not any(s.flagged for s in attribution_shift(summary(even), summary(even)))


def test_without_a_champion_the_asset_fails_and_says_why(tmp_path, explained_home):
    home, _ = explained_home
    import shutil

    shutil.copytree(home / "storage", tmp_path / "storage")
    result = materialize(tmp_path, "2013-02")
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "has no champion yet" in str(failure.event_specific_data.error.message)
