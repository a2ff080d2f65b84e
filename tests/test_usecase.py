"""Use-case declarations: found through the entry points, validated when built, and their features computed by the
platform from the declaration alone (a tiny regression use case declared here, on data this test writes)."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import polars as pl
import pytest

from keel.features.offline import offline_features
from keel.features.online import build_views, get_online_features
from keel.features.spec import (
    Entity,
    Feature,
    FeatureSet,
    FeatureSpecError,
    History,
    Key,
    Label,
    Lookup,
    RequestFeatures,
)
from keel.features.sqlite_store import SQLiteOnlineStore
from keel.usecase import ModelSpec, Monitoring, Serving, UseCase, UseCaseError, by_model, from_module, get, installed


def test_the_flights_use_case_is_found_through_its_entry_point():
    found = installed()
    assert "flights" in found
    flights = get("flights")
    assert flights.model.name == "flight-delay" and flights.task == "binary"
    assert flights.metrics == ("auc", "log_loss")
    assert by_model("flight-delay") is flights
    assert from_module("usecases.flights") is flights
    with pytest.raises(UseCaseError, match="no use case 'ships' is installed; installed: .*flights"):
        get("ships")
    with pytest.raises(UseCaseError, match="served: .*flight-delay"):
        by_model("nope")


# -- a second, tiny use case: room prices per hotel, a regression label -------------------------------------------

ROOM = Entity(
    name="booking",
    source="validated_bookings",
    id_column="booking_id",
    id_parts=("arrival", "hotel", "ref"),
    date="arrival",
    request_columns=("hotel", "arrival", "nights", "city"),
    carried=("hotel", "arrival", "city"),
)


def stay(col, ops):
    return {"nights": ops.as_float(col("nights")), "weekday": ops.as_int(ops.weekday(col("arrival")))}


def tiny_features(**overrides) -> FeatureSet:
    spec = dict(
        entity=ROOM,
        features=(
            Feature("nights", "float", 0, 60, 2, "nights booked"),
            Feature("weekday", "int", 1, 7, 4, "ISO weekday of arrival"),
            Feature("city_index", "float", 0, 10, 1, "the city's price index"),
            Feature("hotel_price", "float", 0, 1000, 100, "the hotel's mean price, earlier days"),
        ),
        label=Label("label_price", pl.col("price"), task="regression", known_after="check-out"),
        request=(RequestFeatures("stay", stay),),
        lookups=(
            Lookup("cities", source="cities", keys=(Key("city", "name"),), fields={"city_index": pl.col("index")}),
        ),
        histories=(History("hotel_price", ("hotel",), pl.col("price"), prior=100.0, weight=5.0),),
    )
    return FeatureSet(**(spec | overrides))


def bookings(days: int = 20) -> pl.DataFrame:
    rng = np.random.default_rng(7)
    n = days * 10
    return pl.DataFrame(
        {
            "ref": np.arange(n),
            "hotel": rng.choice(["h1", "h2", "h3"], n),
            "city": rng.choice(["oslo", "rome"], n),
            "arrival": [date(2020, 1, 1) + timedelta(days=int(i) // 10) for i in range(n)],
            "nights": rng.integers(1, 8, n),
            "price": rng.uniform(50, 300, n),
        }
    )


CITIES = pl.DataFrame({"name": ["oslo", "rome"], "index": [3.5, 2.0]})


def test_a_second_use_case_is_computed_from_its_declaration_offline_and_online_alike(tmp_path):
    fs = tiny_features()
    rows = bookings()
    table = offline_features(fs, rows, {"cities": CITIES}, rows)
    assert table.columns == ["booking_id", "hotel", "arrival", "city", *fs.names, "label_price"]
    assert table.height == rows.height  # no row lost
    # history from earlier days only: day one has the prior, later days the smoothed mean of earlier prices
    first = table.filter(pl.col("arrival") == date(2020, 1, 1))
    assert first["hotel_price"].unique().to_list() == [100.0]
    day = date(2020, 1, 10)
    earlier = rows.filter((pl.col("arrival") < day) & (pl.col("hotel") == "h2"))
    want = (earlier["price"].sum() + 100.0 * 5.0) / (earlier.height + 5.0)
    got = table.filter((pl.col("arrival") == day) & (pl.col("hotel") == "h2"))["hotel_price"]
    assert got.len() > 0 and all(abs(v - want) < 1e-9 for v in got)
    # online, as of the day: the same values as the offline path as of that day
    with SQLiteOnlineStore(tmp_path / "f.sqlite", features=fs) as store:
        store.write_snapshot(build_views(fs, {"cities": CITIES}, rows, as_of=day), as_of=day, partition="x")
        todays = rows.filter(pl.col("arrival") == day)
        offline = offline_features(fs, todays, {"cities": CITIES}, rows, as_of=day)
        served = get_online_features(store, offline.select(fs.entity.request_columns).to_dicts())
        for want_row, got_row in zip(offline.iter_rows(named=True), served, strict=True):
            for name in fs.names:
                assert abs(want_row[name] - got_row[name]) < 1e-9, name
        with pytest.raises(Exception, match="unknown feature 'price'.*nights, weekday"):
            store.freeze("price", "no such feature")


def test_a_history_keyed_by_a_column_with_nulls_counts_no_null_group_offline_or_online(tmp_path):
    """Issue 49 (keel new on the penguins table, whose sex is NA in 11 rows): a row without its group's key counts
    toward no group and is scored with the prior — the online store's snapshot used to fail on a null key."""
    fs = tiny_features()
    rows = bookings().with_columns(
        pl.when(pl.int_range(pl.len()) % 7 == 0).then(None).otherwise(pl.col("hotel")).alias("hotel")
    )
    day = date(2020, 1, 10)
    with SQLiteOnlineStore(tmp_path / "f.sqlite", features=fs) as store:
        views = build_views(fs, {"cities": CITIES}, rows, as_of=day)
        assert views["hotel_price"]["key"].null_count() == 0
        store.write_snapshot(views, as_of=day, partition="x")
        todays = rows.filter(pl.col("arrival") == day)
        offline = offline_features(fs, todays, {"cities": CITIES}, rows, as_of=day)
        served = get_online_features(store, offline.select(fs.entity.request_columns).to_dicts())
        for want_row, got_row in zip(offline.iter_rows(named=True), served, strict=True):
            if want_row["hotel"] is None:
                assert want_row["hotel_price"] == got_row["hotel_price"] == 100.0  # the prior
            assert abs(want_row["hotel_price"] - got_row["hotel_price"]) < 1e-9


def test_the_lineage_is_derived_from_the_declaration():
    sources = tiny_features().column_sources()
    assert sources["nights"] == (("validated_bookings", "nights"),)
    assert sources["weekday"] == (("validated_bookings", "arrival"),)
    assert sources["city_index"] == (("cities", "index"), ("validated_bookings", "city"), ("cities", "name"))
    assert set(sources["hotel_price"]) == {
        ("validated_bookings", "price"),
        ("validated_bookings", "arrival"),
        ("validated_bookings", "hotel"),
    }
    assert sources["label_price"] == (("validated_bookings", "price"),)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"histories": ()},
            "declared but computed by nothing: hotel_price",
        ),
        (
            {"features": tiny_features().features[:3]},
            "computed but not declared: hotel_price",
        ),
        (
            {"histories": (History("hotel_price", ("room",), pl.col("price"), 1.0, 1.0),)},
            "key room is not a request column",
        ),
        (
            {"features": (*tiny_features().features, tiny_features().features[0])},
            "features declared twice: nights",
        ),
    ],
)
def test_an_inconsistent_feature_set_is_refused_naming_what(change, message):
    with pytest.raises(FeatureSpecError, match=message):
        tiny_features(**change)


def test_bad_declarations_are_refused_when_built(tmp_path):
    with pytest.raises(FeatureSpecError, match="default 99 is outside"):
        Feature("x", "float", 0, 1, 99, "")
    with pytest.raises(FeatureSpecError, match="dtype must be one of"):
        Feature("x", "text", 0, 1, 0, "")  # type: ignore[arg-type]
    with pytest.raises(FeatureSpecError, match="task must be binary or regression"):
        Label("y", pl.col("y"), task="ranking")  # type: ignore[arg-type]
    with pytest.raises(UseCaseError, match="serving: tier must be L1, L2 or L3, got 'gold'"):
        Serving("request", tier="gold")
    (tmp_path / "request.yaml").write_text("name: request\n")
    ok = dict(
        name="rooms",
        title="Room prices",
        contracts=tmp_path,
        features=tiny_features(),
        model=ModelSpec("room-price"),
        serving=Serving("request"),
    )
    uc = UseCase(**ok)
    assert uc.metrics == ("rmse", "mae") and uc.task == "regression"
    # drift watches every feature and the label; its first reference is the first model's months
    numeric, categorical = uc.monitored
    assert numeric == [*uc.features.names, uc.features.label.column] and categorical == []
    first = UseCase(
        **ok
        | {
            "period": (date(2024, 1, 1), date(2024, 6, 30)),
            "model": ModelSpec("room-price", train_months=("2024-01", "2024-02"), valid_month="2024-03"),
        }
    )
    assert first.monitoring.reference_months == ("2024-01", "2024-02", "2024-03")
    for change, message in [
        ({"name": "Rooms/x"}, "use case name 'Rooms/x'"),
        ({"contracts": tmp_path / "none"}, "contracts folder .* does not exist"),
        ({"serving": Serving("missing")}, "request contract missing.yaml is not in"),
        ({"metrics": ("auc",)}, r"metrics \['auc'\] do not judge a regression model"),
        (
            {"monitoring": Monitoring(categorical=("colour",))},
            r"monitoring.categorical names unknown columns \['colour'\]",
        ),
        (
            {"monitoring": Monitoring(thresholds={"nope": 0.2})},
            r"monitoring.thresholds names unknown columns \['nope'\]",
        ),
        (
            {
                "period": (date(2024, 1, 1), date(2024, 3, 31)),
                "monitoring": Monitoring(reference_months=("2023-12",)),
            },
            r"drift reference months \['2023-12'\] are outside its period",
        ),
    ]:
        with pytest.raises(UseCaseError, match=message):
            UseCase(**(ok | change))
    with pytest.raises(UseCaseError, match="model name"):
        ModelSpec("Room Price")


def test_a_replay_sends_at_its_own_rate_unless_the_run_names_one():
    """Issue 49: every use case's replay sent 40 req/s whatever its volume; a use case declares its own rate."""
    from keel.usecase import Replay

    def nothing(_):
        return []

    quiet = Replay(requests=nothing, day_of=str, unit_of=str, rps=4)
    assert quiet.rate() == 4 and quiet.rate(override=100) == 100
    assert Replay(requests=nothing, day_of=str, unit_of=str).rate() == Replay.DEFAULT_RPS == 40
    for bad in (0, -1, "fast"):
        with pytest.raises(UseCaseError, match="replay: rps must be a number of requests per second"):
            Replay(requests=nothing, day_of=str, unit_of=str, rps=bad)


def test_a_flag_monitored_as_a_number_is_said_at_load_with_the_fix(tmp_path):
    """Issue 49: a 0/1 flag compared as a number drifts in any month with more or fewer of it (a holiday flag whose
    reference has none is infinitely far in December): the declaration says so when it loads, naming the fix."""
    import dataclasses
    import warnings

    from keel.usecase import UseCaseWarning
    from usecases.flights import usecase as flights
    from usecases.hotels import usecase as hotels

    (tmp_path / "request.yaml").write_text("name: request\n")
    base = tiny_features()
    flagged = tiny_features(
        features=tuple(
            Feature("weekday", "int", 0, 1, 0, "1 on a weekend") if f.name == "weekday" else f for f in base.features
        )
    )
    ok = dict(
        name="rooms",
        title="Rooms",
        contracts=tmp_path,
        features=flagged,
        model=ModelSpec("room-price"),
        serving=Serving("request"),
    )
    with pytest.warns(
        UseCaseWarning, match=r"feature weekday is a 0/1 flag monitored as a number .* monitoring\.categorical"
    ):
        UseCase(**ok)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UseCaseWarning)
        UseCase(**ok | {"monitoring": Monitoring(categorical=("weekday",))})
        UseCase(**ok | {"monitoring": Monitoring(unmonitored=("weekday",))})
        for shipped in (flights, hotels):  # the shipped use cases declare their flags as they mean them
            dataclasses.replace(shipped)
