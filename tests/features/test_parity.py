"""Offline == online for the same inputs, point-in-time correctness, and frozen features — the online side against
each backend of the online store (embedded SQLite, and the real Redis server), which must give the same answers."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest

from keel.features.online import get_online_features
from keel.features.sqlite_store import SQLiteOnlineStore
from tests.features.conftest import BACKENDS, online_store
from usecases.flights.features import (
    FEATURE_NAMES,
    FEATURES,
    FLIGHT_FEATURES,
    REQUEST_COLUMNS,
    build_views,
    offline_features,
)

DAY = date(2013, 2, 15)


def day_flights(validated, day=DAY) -> pl.DataFrame:
    f = validated["flights"]
    return f.filter((pl.col("month") == day.month) & (pl.col("day") == day.day))


def request_rows(offline: pl.DataFrame, flights: pl.DataFrame | None = None) -> list[dict]:
    """What a caller sends for each flight: the request columns, which the offline table carries too."""
    return offline.sort("flight_id").select(REQUEST_COLUMNS).to_dicts()


@pytest.fixture(scope="module", params=BACKENDS)
def store(request, tmp_path_factory, validated):
    with online_store(request.param, tmp_path_factory.mktemp("online")) as s:
        s.write_snapshot(
            build_views(validated["weather"], validated["planes"], validated["flights"], as_of=DAY),
            as_of=DAY,
            partition="2013-02",
        )
        yield s


def test_offline_equals_online_field_by_field(validated, store):
    flights = day_flights(validated)
    offline = offline_features(flights, validated["weather"], validated["planes"], validated["flights"])
    rows = request_rows(offline, flights)
    online = get_online_features(store, rows)
    assert len(online) == offline.height > 800
    for want, got in zip(offline.sort("flight_id").select(FEATURE_NAMES).iter_rows(named=True), online, strict=True):
        for f in FEATURES:
            a, b = want[f.name], got[f.name]
            if a is None or b is None:
                assert a is None and b is None, f.name
            elif f.dtype == pl.Int32:
                assert a == b, f.name
            else:
                assert abs(a - b) <= 1e-12 * max(1.0, abs(a)), (f.name, a, b)
        assert got["degraded"] == []


def test_rates_use_only_earlier_days(validated):
    """A planted leak — a flight later the same day and one the next day, both very late — changes nothing."""
    flights = day_flights(validated)
    base = offline_features(flights, validated["weather"], validated["planes"], validated["flights"])
    template = flights.filter(pl.col("carrier") == "UA").head(1)
    leaks = pl.concat(
        [
            template.with_columns(
                pl.lit(23, pl.Int32).alias("hour"),
                pl.lit(2359, pl.Int32).alias("sched_dep_time"),
                pl.lit(900.0).alias("arr_delay"),
            ),
            template.with_columns(pl.lit(16, pl.Int32).alias("day"), pl.lit(900.0).alias("arr_delay")),
        ]
        * 500
    )
    leaked_history = pl.concat([validated["flights"], leaks])
    after = offline_features(flights, validated["weather"], validated["planes"], leaked_history)
    assert after.select(FEATURE_NAMES).equals(base.select(FEATURE_NAMES))
    # ...while the same rows on an *earlier* day do move the rate: the test can fail
    early = leaks.with_columns(pl.lit(14, pl.Int32).alias("day"))
    moved = offline_features(
        flights, validated["weather"], validated["planes"], pl.concat([validated["flights"], early])
    )
    ua = pl.col("carrier") == "UA"
    assert moved.filter(ua)["carrier_delay_rate"].mean() > base.filter(ua)["carrier_delay_rate"].mean() + 0.01


def test_weather_is_the_scheduled_hour_not_a_later_one(validated):
    flights = day_flights(validated)
    base = offline_features(flights, validated["weather"], validated["planes"], validated["flights"])
    w = validated["weather"]
    later = w.with_columns(pl.col("time_hour") + timedelta(hours=1))  # every observation shifted one hour later
    shifted = offline_features(
        flights,
        pl.concat([w, later]).unique(["origin", "time_hour"], keep="first"),
        validated["planes"],
        validated["flights"],
    )
    assert shifted.select("temp").equals(base.select("temp"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_feature_changes_what_online_serves(validated, tmp_path, backend):
    with online_store(backend, tmp_path) as s:
        frozen_feature_changes_what_online_serves(validated, s)


def frozen_feature_changes_what_online_serves(validated, s):
    s.write_snapshot(
        build_views(validated["weather"], validated["planes"], validated["flights"], as_of=DAY),
        as_of=DAY,
        partition="2013-02",
    )
    flights = day_flights(validated).head(20)
    rows = request_rows(
        offline_features(flights, validated["weather"], validated["planes"], validated["flights"]), flights
    )
    before = get_online_features(s, rows)
    replayed = datetime(2013, 8, 1, 12, tzinfo=UTC)  # a live replay logs the freeze at its simulated time
    s.freeze("temp", reason="drift: temp normalised W1 0.9 > 0.15 in 2013-07", value=41.5, at=replayed)
    after = get_online_features(s, rows)
    assert {r["temp"] for r in after} == {41.5} and {r["temp"] for r in before} != {41.5}
    assert all(r["degraded"] == ["temp"] for r in after)
    assert [r["wind_speed"] for r in after] == [r["wind_speed"] for r in before]
    s.unfreeze("temp", reason="drift resolved")
    assert get_online_features(s, rows) == before
    log = s.freeze_log()
    assert [(e.feature, e.action) for e in log] == [("temp", "freeze"), ("temp", "unfreeze")]
    assert "2013-07" in log[0].reason and log[0].at == replayed
    assert log[1].at.year == datetime.now(UTC).year  # no time given: now


def test_unknown_entities_are_missing_not_zero(store):
    [row] = get_online_features(
        store,
        [
            {
                "carrier": "ZZ",
                "origin": "EWR",
                "dest": "XXX",
                "tailnum": "N0NE",
                "sched_date": "2013-02-15",
                "hour": 9,
                "time_hour": "2030-01-01T14:00:00Z",
                "distance": 100.0,
            }
        ],
    )
    assert row["temp"] is None and "temp" in row["missing"] and row["plane_age"] is None
    assert row["carrier_delay_rate"] == pytest.approx(0.2)  # an unseen carrier gets the prior, by definition


def test_read_cache_serves_the_same_answers_and_follows_new_snapshots(validated, tmp_path):
    path = tmp_path / "cached.sqlite"
    writer = SQLiteOnlineStore(path, features=FLIGHT_FEATURES)
    cached = SQLiteOnlineStore(path, features=FLIGHT_FEATURES, cache_size=10_000)
    views = build_views(validated["weather"], validated["planes"], validated["flights"], as_of=DAY)
    writer.write_snapshot(views, as_of=DAY, partition="2013-02")
    flights = day_flights(validated)
    rows = request_rows(offline_features(flights, validated["weather"], validated["planes"], validated["flights"]))
    first = get_online_features(writer, rows)
    assert get_online_features(cached, rows) == first
    assert get_online_features(cached, rows) == first  # now from the cache
    later = DAY + timedelta(days=5)  # another process writes a newer snapshot: five more days of history
    writer.write_snapshot(
        build_views(validated["weather"], validated["planes"], validated["flights"], as_of=later),
        as_of=later,
        partition="2013-02",
    )
    fresh = get_online_features(writer, rows)
    assert fresh != first  # the new snapshot changed the delay rates...
    assert get_online_features(cached, rows) == fresh  # ...and the cached reader follows it
