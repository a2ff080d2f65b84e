"""The checks on online_features. online_distribution compares like with like: the same flights, as of the same time,
with a measure that fits few-valued features — quiet on a correct store, loud when the serving path is wrong.
feature_health reads hot keys back and says what is wrong: stale, nothing verified, values out of range."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from keel.features.checks import feature_health, online_distribution, population_stability, value_centred_stability
from keel.features.online import get_online_features
from keel.features.sqlite_store import SQLiteOnlineStore
from usecases.flights.features import FEATURE_NAMES, FLIGHT_FEATURES, REQUEST_COLUMNS, build_views, offline_features

AS_OF = date(2013, 3, 1)  # the store's snapshot: the end of February


@pytest.fixture(scope="module")
def february(validated, tmp_path_factory):
    """The store as of February's end and the offline path for its last week's flights, as of the same time."""
    store = SQLiteOnlineStore(tmp_path_factory.mktemp("dist") / "f.sqlite", features=FLIGHT_FEATURES)
    store.write_snapshot(
        build_views(validated["weather"], validated["planes"], validated["flights"], as_of=AS_OF),
        as_of=AS_OF,
        partition="2013-02",
    )
    week = validated["flights"].filter((pl.col("month") == 2) & (pl.col("day") >= 22)).sample(600, seed=3)
    offline = offline_features(week, validated["weather"], validated["planes"], validated["flights"], as_of=AS_OF)
    yield store, offline
    store.close()


def test_a_correct_store_has_no_distribution_alarm(february):
    store, offline = february
    served = get_online_features(store, offline.select(REQUEST_COLUMNS).to_dicts())
    stability = online_distribution(FLIGHT_FEATURES, offline, served)
    psi = {s.feature: s.psi for s in stability}
    assert all(v is not None and v < 1e-6 for v in psi.values()), psi
    # the delay rates early in the year take few values: compared value by value, not in 0.05-wide bins
    assert {s.feature: s.measure for s in stability}["carrier_delay_rate"] == "values"


def test_a_serving_path_bug_is_caught(february):
    """The store serves every carrier's rate 0.05 too high (more than the gaps between rates): the check fires on
    that feature, and only on it."""
    store, offline = february
    served = get_online_features(store, offline.select(REQUEST_COLUMNS).to_dicts())
    shifted = [r | {"carrier_delay_rate": r["carrier_delay_rate"] + 0.05} for r in served]
    psi = {s.feature: s.psi for s in online_distribution(FLIGHT_FEATURES, offline, shifted)}
    assert psi["carrier_delay_rate"] > 0.25 and psi["temp"] < 1e-6


def test_frozen_features_are_not_compared(february):
    store, offline = february
    store.freeze("temp", reason="test freeze", value=41.5)
    try:
        served = get_online_features(store, offline.select(REQUEST_COLUMNS).to_dicts())
    finally:
        store.unfreeze("temp", reason="test done")
    by_feature = {s.feature: s for s in online_distribution(FLIGHT_FEATURES, offline, served)}
    assert by_feature["temp"].measure == "frozen" and by_feature["temp"].psi is None
    assert by_feature["wind_speed"].psi < 1e-6


def test_a_tiny_move_across_a_bin_edge_is_not_an_alarm_for_few_values():
    """The old false alarm: a few distinct rates, one of them 0.0005 below a 0.05 edge, served 0.0005 above it."""
    rng = np.random.default_rng(0)
    values = np.array([0.12, 0.1995, 0.26, 0.31, 0.37, 0.44])  # 0.1995: just below the 0.20 edge
    expected = rng.choice(values, 2000)
    nudged = np.where(expected == 0.1995, 0.2005, expected)
    edges = np.linspace(0, 1, 21)[1:-1]
    assert population_stability(expected, nudged, edges) > 0.25  # fixed-width bins explode
    assert value_centred_stability(expected, nudged) == pytest.approx(0.0, abs=1e-12)
    assert value_centred_stability(expected, expected + 0.05) > 0.25  # a real shift (2.5 gaps) still shows


def test_feature_health_reads_hot_keys_back_and_says_what_is_wrong(february):
    store, offline = february
    hot = offline.drop_nulls(FEATURE_NAMES).head(50).select(REQUEST_COLUMNS).to_dicts()
    assert len(hot) == 50
    now = datetime.now(UTC)
    healthy = feature_health(store, hot, max_age=timedelta(hours=36), now=now)
    assert healthy.healthy and healthy.sampled == 50
    # a store nobody wrote for two days is not fresh
    stale = feature_health(store, hot, max_age=timedelta(hours=36), now=now + timedelta(days=2))
    assert not stale.healthy and not stale.fresh
    # nothing to read back is not "healthy": the check would have verified nothing
    empty = feature_health(store, [], max_age=timedelta(hours=36), now=now)
    assert not empty.healthy and "no hot keys" in empty.problems[0]
    # a value outside the feature's declared range is named
    store.freeze("temp", reason="test: out of range", value=500.0)
    try:
        bad = feature_health(store, hot, max_age=timedelta(hours=36), now=now)
    finally:
        store.unfreeze("temp", reason="test done")
    assert not bad.healthy and any(p.startswith("temp: 50 values outside") for p in bad.problems), bad.problems
