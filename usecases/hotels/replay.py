"""The hotels use case's live traffic: each request asks for the rate of a real booking on the day it was made
(``quoted_on``), as the hotel's booking engine would while the guest books. Only contract-valid bookings are asked
(what the model is trained for); bookings made before the data's first month are never asked."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import polars as pl

from usecases.hotels.data import read_bookings

DATES = ("quoted_on", "arrival_date")  # sent as YYYY-MM-DD text, as the request contract reads them


@lru_cache(maxsize=1)
def request_contract():
    """The rate-request contract (contracts/rate_request.yaml): its columns are what a quote sends."""
    from keel.contracts.spec import load_contract

    return load_contract(Path(__file__).parent / "contracts" / "rate_request.yaml")


@lru_cache(maxsize=1)
def valid_bookings() -> pl.DataFrame:
    """Every contract-valid booking (validated month by month of arrival, as the pipeline does)."""
    from keel.contracts.engine import CompiledContract
    from keel.contracts.spec import load_contract

    contract = CompiledContract(load_contract(Path(__file__).parent / "contracts" / "bookings.yaml"))
    raw = read_bookings()
    months = raw.select("year", "month").unique().sort("year", "month").iter_rows()
    return pl.concat(
        [contract.validate(raw.filter((pl.col("year") == y) & (pl.col("month") == m))).valid for y, m in months],
        how="diagonal_relaxed",
    )


def quotes(month: str, limit: int = 20_000) -> list[dict]:
    """The month's rate quotes as request entities (contract ``rate_request``): the valid bookings made in ``month``
    (YYYY-MM), in the order they were made."""
    first = pl.lit(f"{month}-01").str.to_date()
    made = valid_bookings().filter((pl.col("quoted_on") >= first) & (pl.col("quoted_on") < first.dt.offset_by("1mo")))
    fields = [c for c in request_contract().column_names if c not in DATES]  # what a quote sends, said once
    return (
        made.sort("quoted_on", "booking_ref")
        .head(limit)
        .select(*fields, *(pl.col(d).dt.strftime("%Y-%m-%d") for d in DATES))
        .to_dicts()
    )


def day_of(quote: dict) -> str:
    """The day the booking is made, YYYY-MM-DD."""
    return quote["quoted_on"]


def unit_of(quote: dict) -> str:
    return f"booking-{quote['booking_ref']}"
