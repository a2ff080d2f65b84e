"""The flight key: how an answer the gateway gave meets the outcome that arrives later.

``carrier-flight-origin-YYYY-MM-DDTHH:MM:SSZ`` (the scheduled hour, UTC), e.g. ``UA-1545-EWR-2013-01-01T10:00:00Z``.
The gateway writes it into each exposure record of a one-flight request (``flight_key``); the canary and guardrail
sensors, experiment analysis and the lake join it to validated flights' ``arr_delay``. This module is its only
spelling: the record form (``flight_key``), the frame form (``flight_key_expr``) and the parts read back
(``key_month``, ``key_carrier``, ``key_origin``, ``key_hour``).

The parts are read from the ends, not by splitting on ``-``: the timestamp has dashes of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
STAMP_LENGTH = len("2013-01-01T10:00:00Z")


def flight_key(flight: Mapping[str, Any]) -> str:
    """The key of one flight record (``time_hour`` a datetime or its ISO text as requests carry it)."""
    th = flight["time_hour"]
    stamp = th.strftime(STAMP_FORMAT) if hasattr(th, "strftime") else str(th)
    return f"{flight['carrier']}-{flight.get('flight')}-{flight['origin']}-{stamp}"


def flight_key_expr(stamp_format: str = STAMP_FORMAT) -> pl.Expr:
    """The key as a polars expression over a frame with carrier, flight, origin and a datetime ``time_hour``.
    ``stamp_format`` coarsens the stamp for keys that only need the hour (the experiment simulator's units)."""
    return pl.concat_str(
        [pl.col("carrier"), pl.col("flight").cast(pl.String), pl.col("origin"), pl.col("time_hour").dt.strftime(stamp_format)],
        separator="-",
    )  # fmt: skip


def key_month(key: pl.Expr) -> pl.Expr:
    """YYYY-MM of the scheduled hour: which month's validated flights hold the outcome."""
    return key.str.slice(-STAMP_LENGTH, 7)


def key_hour(key: pl.Expr) -> pl.Expr:
    """The scheduled hour (UTC) as an integer."""
    return key.str.slice(-9, 2).cast(pl.Int32, strict=False)  # …THH:MM:SSZ


def key_carrier(key: pl.Expr) -> pl.Expr:
    return key.str.split("-").list.get(0, null_on_oob=True)


def key_origin(key: pl.Expr) -> pl.Expr:
    return key.str.split("-").list.get(2, null_on_oob=True)
