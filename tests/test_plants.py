"""A data drill's planted change (keel/data/plants.py) lands as declared: from its day on, the declared share of a
day's rows carry the planted value — the same rows on every run —, the days before are as delivered, no row is added
or lost; a plants file that cannot be applied is refused naming the file, the entry and the field."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import polars as pl
import pytest

from keel.data.landing import LandingZone
from keel.data.plants import PlantError
from usecases.flights import usecase as FLIGHTS
from usecases.flights.data import read_raw_month

LATE = {"usecase": "flights", "table": "flights", "from_day": "2013-01-03", "column": "arr_delay", "value": "60",
        "share": 0.2, "seed": 46, "why": "a fifth of the flights from Jan 3 on land late"}  # fmt: skip


def planted(tmp_path, *plants: dict) -> LandingZone:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "plants.json").write_text(json.dumps(list(plants)))
    return LandingZone(tmp_path, FLIGHTS)


def test_from_its_day_the_declared_share_of_rows_carries_the_planted_value_and_no_row_is_lost(tmp_path):
    zone = planted(tmp_path, LATE | {"until_day": "2013-01-04"})
    zone.deliver(datetime(2013, 1, 6, 12, tzinfo=UTC))
    raw = read_raw_month("flights", "2013-01").sort("_source_row")
    landed = zone.read_month("flights", "2013-01").sort("_source_row")
    assert landed["_source_row"].to_list() == raw[: landed.height]["_source_row"].to_list()  # every row, once
    both = raw.join(landed, on="_source_row", suffix="_landed")
    changed = both.filter(pl.col("arr_delay") != pl.col("arr_delay_landed"))
    assert set(changed["day"]) == {"3", "4"}  # from its day, to its last; Jan 1–2 and 5 land as delivered
    assert set(changed["arr_delay_landed"]) == {"60"}
    for day in ("3", "4"):
        rows = both.filter(pl.col("day") == day)
        chosen = (
            rows.filter(pl.col("arr_delay_landed") == "60").height - rows.filter(pl.col("arr_delay") == "60").height
        )
        assert 0.15 < chosen / rows.height < 0.25, (
            day,
            chosen,
            rows.height,
        )  # ~a fifth (the rows already at 60 aside)
    # a missing value stays missing: a cancelled flight gets no arrival delay (the contracts would refuse it)
    cancelled = both.filter(pl.col("day").is_in(["3", "4"]) & pl.col("arr_delay").is_null())
    assert cancelled.height > 0 and cancelled["arr_delay_landed"].null_count() == cancelled.height
    # the same rows on another run, in another home
    again = planted(tmp_path / "again", LATE | {"until_day": "2013-01-04"})
    again.deliver(datetime(2013, 1, 6, 12, tzinfo=UTC))
    assert again.read_month("flights", "2013-01").sort("_source_row").equals(landed)


def test_other_tables_and_use_cases_land_as_delivered(tmp_path):
    zone = planted(tmp_path, LATE, LATE | {"usecase": "hotels", "table": "bookings"})
    zone.deliver(datetime(2013, 1, 5, 12, tzinfo=UTC))
    weather = zone.read_month("weather", "2013-01")
    assert weather.equals(
        read_raw_month("weather", "2013-01").filter(pl.col("_source_row").is_in(weather["_source_row"]))
    )


@pytest.mark.parametrize(
    ("plants", "message"),
    [
        ("not json", "not JSON"),
        ({"usecase": "flights"}, "a list of plants"),
        ([LATE | {"shares": 0.2}], "entry 0: unknown field(s) shares"),
        ([LATE, {k: v for k, v in LATE.items() if k != "column"}], "entry 1: missing column"),
        ([LATE | {"share": 1.5}], "entry 0 field share: a number from 0 to 1"),
        ([LATE | {"value": 60}], "entry 0 field value: text"),
        ([LATE | {"from_day": "Jan 3"}], "entry 0: from_day/until_day are YYYY-MM-DD"),
        ([LATE | {"until_day": "2013-01-01"}], "until_day 2013-01-01 is before from_day 2013-01-03"),
        ([LATE | {"table": "planes"}], "flights lands flights, weather, not 'planes'"),
    ],
)
def test_a_plants_file_that_cannot_be_applied_is_refused_naming_the_entry_and_field(tmp_path, plants, message):
    (tmp_path / "plants.json").write_text(plants if isinstance(plants, str) else json.dumps(plants))
    with pytest.raises(PlantError, match="plants.json") as refused:
        LandingZone(tmp_path, FLIGHTS)
    assert message in str(refused.value)


def test_a_column_the_table_does_not_have_is_named_when_its_day_lands(tmp_path):
    zone = planted(tmp_path, LATE | {"column": "arrival_delay"})
    zone.deliver(datetime(2013, 1, 3, 12, tzinfo=UTC))  # Jan 1 and 2: before the plant's day
    with pytest.raises(PlantError, match="no column 'arrival_delay'"):
        zone.deliver(datetime(2013, 1, 4, 12, tzinfo=UTC))
    assert zone.delivered("flights") == [date(2013, 1, 1), date(2013, 1, 2)]  # nothing half-written
