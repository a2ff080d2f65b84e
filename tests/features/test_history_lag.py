"""A history whose values become known after the row's own day (``History.known_on``: a stay's price once the stay
is over): offline it counts a row only from the day after its value became known, and the online store, built as of
a day, agrees with the offline table."""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl
import pytest

from keel.features.offline import offline_features
from keel.features.online import build_views, get_online_features
from keel.features.spec import Entity, Feature, FeatureSet, FeatureSpecError, History, Label
from keel.features.sqlite_store import SQLiteOnlineStore

LAG = 3


def feature_set(lag: int) -> FeatureSet:
    return FeatureSet(
        entity=Entity(
            name="stay",
            source="validated_stays",
            id_column="stay_id",
            id_parts=("ref",),
            date="arrival",
            date_parts=("year", "month", "day"),
            request_columns=("room", "arrival"),
            carried=("room", "arrival"),
        ),
        features=(Feature("room_price", "float", 0, 1000, 100, "the room's mean price, known stays"),),
        label=Label("label_price", pl.col("price"), task="regression"),
        histories=(
            History(
                "room_price",
                ("room",),
                pl.col("price"),
                prior=100.0,
                weight=1.0,
                known_on=pl.col("arrival") + pl.duration(days=lag) if lag else None,
            ),
        ),
    )


def stays(first: date, days: int) -> pl.DataFrame:
    """One stay a day in room "a", priced 10 × its day number (day 0 costs 0, day 1 costs 10, ...)."""
    rows = [first + timedelta(days=i) for i in range(days)]
    return pl.DataFrame(
        {
            "ref": list(range(days)),
            "room": ["a"] * days,
            "year": [d.year for d in rows],
            "month": [d.month for d in rows],
            "day": [d.day for d in rows],
            "price": [10.0 * i for i in range(days)],
        }
    )


def expected(i: int, lag: int) -> float:
    """The smoothed mean on day i: the stays of days 0 … i - lag - 1 (prior 100, weight 1)."""
    known = [10.0 * j for j in range(max(0, i - lag))]
    return (sum(known) + 100.0) / (len(known) + 1)


@pytest.mark.parametrize("lag", [0, LAG])
def test_a_row_counts_only_from_the_day_its_value_is_known(lag):
    rows = stays(date(2020, 1, 1), 10)
    table = offline_features(feature_set(lag), rows, {}, rows).sort("arrival")
    got = table["room_price"].to_list()
    assert got == pytest.approx([expected(i, lag) for i in range(10)])
    if lag:  # the lag really hides the latest stays: day 5 sees days 0 and 1 only
        assert got[5] == pytest.approx((0 + 10 + 100) / 3)


def test_the_online_store_as_of_a_day_serves_what_the_offline_table_holds_for_that_day(tmp_path):
    fs = feature_set(LAG)
    rows = stays(date(2020, 1, 1), 10)
    day = date(2020, 1, 8)  # day number 7: stays of days 0 … 3 are known
    store = SQLiteOnlineStore(tmp_path / "features.sqlite", features=fs)
    try:
        store.write_snapshot(build_views(fs, {}, rows, as_of=day), as_of=day, partition="2020-01")
        online = get_online_features(store, [{"room": "a", "arrival": day}])
    finally:
        store.close()
    offline = offline_features(fs, rows.filter(pl.col("day") == day.day), {}, rows)
    assert online[0]["room_price"] == pytest.approx(offline["room_price"][0]) == pytest.approx(expected(7, LAG))


def test_known_on_may_be_another_column_of_the_row():
    """Each stay's price is known on its own check-out day (a column), not a fixed lag after arrival."""
    rows = stays(date(2020, 1, 1), 6).with_columns(
        checkout=pl.date(2020, 1, pl.col("day")) + pl.duration(days=pl.Series([5, 1, 1, 1, 1, 1]))
    )  # the day-0 stay is long (out on day 5), the others leave the next day
    fs = feature_set(0)
    fs = FeatureSet(
        entity=fs.entity,
        features=fs.features,
        label=fs.label,
        histories=(History("room_price", ("room",), pl.col("price"), 100.0, 1.0, known_on=pl.col("checkout")),),
    )
    got = offline_features(fs, rows, {}, rows).sort("arrival")["room_price"].to_list()
    # day 3 sees the stays out by day 2: day 1's (10, out on day 2); day 0's (0) is still in the house until day 5
    assert got[3] == pytest.approx((10 + 100) / 2)
    assert got[5] == pytest.approx((10 + 20 + 30 + 100) / 4)  # out by day 4: days 1, 2, 3
    # the column lineage names what the history read, the check-out day included
    assert ("validated_stays", "checkout") in fs.column_sources()["room_price"]


def test_known_on_must_be_an_expression_and_is_refused_by_name():
    with pytest.raises(FeatureSpecError, match="room_price: known_on must be a polars expression"):
        History("room_price", ("room",), pl.col("price"), prior=1.0, weight=1.0, known_on="checkout")
