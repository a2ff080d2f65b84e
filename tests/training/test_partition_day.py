"""Rows are chosen for training, early-stopping and the gate by their partition's month and day: a booking's arrival,
though it is scored as of the day it was made (``Entity.partition_date``); by default the entity date."""

from __future__ import annotations

from datetime import date

import polars as pl
import pytest

from keel.features.spec import FeatureSpecError
from keel.training.model import month_of
from usecases.flights.features import FLIGHT_FEATURES
from usecases.hotels.features import RATE_FEATURES


def test_a_booking_belongs_to_its_arrival_month_not_its_quote_month():
    rows = pl.DataFrame(
        {
            "quoted_on": [date(2016, 8, 20), date(2016, 10, 3), date(2016, 10, 30)],
            "arrival_date": ["2016-10-02", "2016-10-20", "2016-11-01"],  # as the source carries it: text
        }
    )
    october = month_of(rows, "2016-10", RATE_FEATURES)
    assert october["quoted_on"].to_list() == [date(2016, 8, 20), date(2016, 10, 3)]  # quoted in August and October
    late = october.filter(RATE_FEATURES.entity.partition_day.dt.day() >= 15)  # a gate's second half: by arrival day
    assert late["arrival_date"].to_list() == ["2016-10-20"]


def test_without_a_partition_date_the_entity_date_decides():
    day = FLIGHT_FEATURES.entity.date
    rows = pl.DataFrame({day: [date(2013, 3, 31), date(2013, 4, 1)]})
    assert month_of(rows, "2013-04", FLIGHT_FEATURES)[day].to_list() == [date(2013, 4, 1)]


def test_a_partition_date_the_table_does_not_keep_is_refused():
    from dataclasses import replace

    with pytest.raises(FeatureSpecError, match="must be a carried column"):
        replace(RATE_FEATURES.entity, partition_date="checkout_day")
