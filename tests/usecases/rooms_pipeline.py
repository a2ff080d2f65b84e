"""The rooms use case's data and pipeline for its tests (tests/usecases/rooms declares it): four months of synthetic
bookings written to a folder, and October…December 2009 of its generated pipeline materialized by real Dagster."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import polars as pl

import tests.usecases.rooms as rooms
from tests.usecases.pipeline_runner import pipeline_runner

MONTHS = ("2009-10", "2009-11", "2009-12", "2010-01")  # before the platform's other calendars
BASE = {"h1": 80.0, "h2": 150.0, "h3": 260.0}
CITY = {"oslo": 1.4, "rome": 1.0}


def write_bookings(folder) -> pl.DataFrame:
    """Four months of bookings, ~20 a day: the price is the hotel's base × the city's index × a weekend premium,
    plus noise; three rows break the contract (a negative price)."""
    rng = np.random.default_rng(2020)
    rows = []
    day, ref = date(2009, 10, 1), 0
    while day <= date(2010, 1, 31):
        for _ in range(20):
            hotel, city = str(rng.choice(list(BASE))), str(rng.choice(list(CITY)))
            nights = int(rng.integers(1, 8))
            price = BASE[hotel] * CITY[city] * (1.3 if day.isoweekday() >= 6 else 1.0) + rng.normal(0, 8)
            rows.append((ref, hotel, city, day.year, day.month, day.day, nights, round(price, 2)))
            ref += 1
        day += timedelta(days=1)
    frame = pl.DataFrame(
        rows, schema=["ref", "hotel", "city", "year", "month", "day", "nights", "price"], orient="row"
    )
    frame = frame.with_columns(
        pl.when(pl.col("ref").is_in([5, 700, 1500])).then(-1.0).otherwise(pl.col("price")).alias("price")
    )
    frame.write_csv(folder / "bookings.csv")
    pl.DataFrame({"name": list(CITY), "index": list(CITY.values())}).write_csv(folder / "cities.csv")
    return frame


def build(home, data, instance=None):
    """Write the bookings, point the declaration at them and materialize October…December 2009 of the rooms pipeline
    (all but its deployment) on ``home``; returns the bookings, a runner of more assets and the keys by name."""
    data.mkdir(exist_ok=True)
    bookings = write_bookings(data)
    rooms.DATA = data
    uc = rooms.usecase
    run, by_name = pipeline_runner(uc, home, instance)

    run(["raw_cities"])
    for month in MONTHS[:3]:
        run(["raw_bookings", "validated_bookings", "bookings_quarantine", "room_features", "online_features"], month)
    return bookings, run, by_name
