"""A second use case, declared by the tests and installed nowhere: room prices per hotel, a regression label.

Its raw tables are CSV files a test writes into ``DATA`` (set it before materializing); its contracts are the files
beside this module. A runtime serves it with ``--usecase tests.usecases.rooms`` (keel/usecase.py ``resolve``).
Nothing in keel/ or gpu_runtime/ knows it: keel builds its assets, store, model and serving from this declaration.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import polars as pl

from keel.features.spec import Entity, Feature, FeatureSet, History, Key, Label, Lookup, RequestFeatures
from keel.usecase import ModelSpec, Serving, Source, UseCase

DATA: Path | None = None  # where a test wrote bookings.csv and cities.csv


def _read(table: str):
    def read() -> pl.DataFrame:
        if DATA is None:
            raise RuntimeError("tests.usecases.rooms.DATA is not set: write the test's data first")
        df = pl.read_csv(DATA / f"{table}.csv", infer_schema=False)
        return df.with_row_index("_source_row").with_columns(pl.col("_source_row").cast(pl.Int64))

    return read


def stay(col, ops):
    """Features of the stay being priced."""
    return {"nights": ops.as_float(col("nights")), "weekday": ops.as_int(ops.weekday(col("arrival")))}


FEATURES = FeatureSet(
    entity=Entity(
        name="booking",
        source="validated_bookings",
        id_column="booking_id",
        id_parts=("ref",),
        date="arrival",
        date_parts=("year", "month", "day"),
        request_columns=("hotel", "city", "arrival", "nights"),
        carried=("hotel", "city", "arrival"),
    ),
    features=(
        Feature("nights", "float", 0, 60, 2, "nights booked"),
        Feature("weekday", "int", 1, 7, 4, "ISO weekday of arrival"),
        Feature("city_index", "float", 0, 10, 1, "the city's price index"),
        Feature("hotel_price", "float", 0, 5000, 150, "the hotel's mean price, earlier days"),
    ),
    label=Label("label_price", pl.col("price"), task="regression", known_after="check-out", description="price paid"),
    request=(RequestFeatures("stay", stay),),
    lookups=(
        Lookup(
            "city",
            source="raw_cities",
            keys=(Key("city", "name"),),
            fields={"city_index": pl.col("index").cast(pl.Float64)},
        ),
    ),
    histories=(History("hotel_price", ("hotel",), pl.col("price"), prior=150.0, weight=5.0),),
)

usecase = UseCase(
    name="rooms",
    title="Room prices (a test's use case)",
    contracts=Path(__file__).parent / "contracts",
    features=FEATURES,
    model=ModelSpec(
        "room-price",
        asset="price_model",
        train_months=("2009-10", "2009-11"),
        valid_month="2009-12",
        params={"objective": "regression", "min_data_in_leaf": 20},
    ),
    serving=Serving("price_request", pool_budget_bytes=8 << 20),
    sources=(
        Source("bookings", _read("bookings"), description="Bookings, as text.", origin="written by the test"),
        Source("cities", _read("cities"), partitioned=False, origin="written by the test"),
    ),
    period=(date(2009, 10, 1), date(2010, 1, 31)),  # before 2013, across a new year
    segments=("hotel",),
    feature_table="room_features",
)
