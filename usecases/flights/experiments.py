"""The flights use case's experiments: validated flights as the units of simulated rebooking-offer experiments
(keel.experiments.simulator draws what passengers do; the impact predictor learns from them), and the rows of its
shipped causal analysis (low visibility → departure delay, usecases/flights/causal/low_visibility.yaml)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from keel.experiments.simulator import hour_band
from usecases.flights.features import FLIGHT, LATE_MINUTES


def flight_units(flights: pl.DataFrame) -> pl.DataFrame:
    """Validated flights as experiment units: id, segment columns, the real outcome (late > 15 min) and what one
    accepted rebooking offer is worth (its fare: 40 + distance / 10 USD)."""
    return flights.filter(pl.col("arr_delay").is_not_null()).select(
        FLIGHT.key.expr(stamp_format="%Y-%m-%dT%H").alias("unit_id"),
        "carrier",
        "origin",
        pl.col("hour").cast(pl.Int32),
        hour_band(pl.col("hour")).alias("hour_band"),
        pl.col("distance").cast(pl.Float64),
        (40.0 + pl.col("distance").cast(pl.Float64) / 10.0).alias("offer_value"),  # a rebooking's fare, USD
        (pl.col("arr_delay") > LATE_MINUTES).cast(pl.Int8).alias("late"),
        pl.col("time_hour").dt.date().alias("day"),
    )


def low_visibility_frame(flights: pl.DataFrame, weather: pl.DataFrame, miles: float = 3.0) -> pl.DataFrame:
    """The shipped observational example on real data: each departed flight with the visibility at its origin in
    its scheduled hour; treatment low_visibility = visib < ``miles``; outcome dep_delay (minutes)."""
    w = weather.select("origin", "time_hour", "visib").unique(["origin", "time_hour"], keep="first")
    return (
        flights.filter(pl.col("dep_delay").is_not_null())
        .join(w, on=["origin", "time_hour"], how="inner")
        .filter(pl.col("visib").is_not_null())
        .select(
            (pl.col("visib") < miles).cast(pl.Int8).alias("low_visibility"),
            pl.col("dep_delay").cast(pl.Float64),
            pl.col("month").cast(pl.String),  # categorical: adjusted for as strata, not as a line
            pl.col("hour").cast(pl.String),
            "carrier",
            "origin",
        )
    )


def causal_data() -> pl.DataFrame:
    """The rows of the shipped causal analysis on the whole year: every 2013 flight and weather row through its
    contract (what ``keel experiment causal`` reads without ``--data``)."""
    from keel.contracts.engine import CompiledContract
    from keel.contracts.spec import load_contract
    from usecases.flights.data import read_raw

    contracts = Path(__file__).parent / "contracts"
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    valid = {}
    for table in ("flights", "weather"):
        compiled = CompiledContract(load_contract(contracts / f"{table}.yaml"))
        valid[table] = compiled.validate(read_raw(table), references=refs).valid
    return low_visibility_frame(valid["flights"], valid["weather"])
