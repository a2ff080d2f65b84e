"""The landing zone delivers 2013 day by day as the simulated clock passes: nothing early, nothing twice, no row
lost, no outcome before its flight landed."""

from __future__ import annotations

from datetime import UTC, date, datetime

import polars as pl
import pytest

from keel.data.landing import LandingZone, due
from keel.data.nycflights import read_raw_month


def test_a_day_lands_only_once_its_outcomes_are_known(tmp_path):
    zone = LandingZone(tmp_path)
    assert due("flights", date(2013, 4, 2)) == datetime(2013, 4, 3, 12, tzinfo=UTC)
    landed = zone.deliver(datetime(2013, 1, 2, 11, 59, tzinfo=UTC))
    assert landed == {"flights": [], "weather": [date(2013, 1, 1)]}  # weather of Jan 1 is in, its flights are not
    landed = zone.deliver(datetime(2013, 1, 2, 12, 0, tzinfo=UTC))
    assert landed == {"flights": [date(2013, 1, 1)], "weather": []}
    flights = zone.read_month("flights", "2013-01")
    assert set(flights["day"]) == {"1"} and flights["arr_delay"].null_count() < flights.height  # outcomes present


def test_delivery_is_idempotent_and_resumes(tmp_path):
    zone = LandingZone(tmp_path)
    now = datetime(2013, 1, 10, 13, tzinfo=UTC)
    first = zone.deliver(now)
    assert len(first["flights"]) == 9 and len(first["weather"]) == 9
    assert zone.deliver(now) == {"flights": [], "weather": []}  # a restarted replay writes nothing twice
    assert LandingZone(tmp_path).delivered("flights")[-1] == date(2013, 1, 9)


@pytest.mark.parametrize("table", ["flights", "weather"])
def test_a_complete_month_is_every_raw_row_exactly_once(tmp_path, table):
    zone = LandingZone(tmp_path)
    zone.deliver(datetime(2013, 3, 2, 12, tzinfo=UTC))
    assert zone.month_complete(table, "2013-02") and not zone.month_complete(table, "2013-03")
    landed = zone.read_month(table, "2013-02")
    raw = read_raw_month(table, "2013-02")
    assert landed["_source_row"].to_list() == sorted(raw["_source_row"].to_list())
    assert landed.equals(raw.sort("_source_row"))
    partial = zone.read_month(table, "2013-03")
    assert set(partial["day"]) == {"1"} and partial.columns == raw.columns


def test_a_month_with_nothing_landed_is_empty_with_the_raw_columns(tmp_path):
    empty = LandingZone(tmp_path).read_month("flights", "2013-06")
    assert empty.height == 0 and "arr_delay" in empty.columns and empty.schema["arr_delay"] == pl.String
    with pytest.raises(ValueError, match="not 'planes'"):
        LandingZone(tmp_path).path("planes", date(2013, 1, 1))
