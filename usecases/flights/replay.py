"""The flights use case's live traffic: each request asks about a real flight of the month (its validated rows, in
scheduled order), as a booking system would before the flight departs."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from usecases.flights.data import read_raw, read_raw_month

REQUEST_FIELDS = ("carrier", "flight", "origin", "dest", "tailnum", "year", "month", "day", "hour", "distance")


def held_out_flights(month: str, limit: int = 20_000) -> list[dict]:
    """The month's contract-valid flights as request entities (contract ``predict_request``), in scheduled order."""
    from keel.contracts.engine import CompiledContract
    from keel.contracts.spec import load_contract

    contract = CompiledContract(load_contract(Path(__file__).parent / "contracts" / "flights.yaml"))
    valid = contract.validate(
        read_raw_month("flights", month), references={"planes.tailnum": read_raw("planes")["tailnum"]}
    ).valid
    return (
        valid.sort("time_hour", "carrier", "flight")
        .head(limit)
        .select(*REQUEST_FIELDS, pl.col("time_hour").dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
        .to_dicts()
    )


def day_of(flight: dict) -> str:
    """The flight's scheduled local day, YYYY-MM-DD."""
    return f"{flight['year']}-{flight['month']:02d}-{flight['day']:02d}"


def unit_of(flight: dict) -> str:
    return f"{flight['carrier']}{flight['flight']}-{flight['time_hour']}"
