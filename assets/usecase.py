"""The use case this wiring builds (usecases/flights): its asset keys live under its name (``flights/…``) and its
asset groups carry it (``flights_raw``, …), so another use case's assets never collide with them."""

from __future__ import annotations

import dagster as dg

from usecases.flights import usecase as FLIGHTS

PREFIX = FLIGHTS.name


def key(name: str) -> dg.AssetKey:
    """The use case's asset ``name``: ``flights/<name>``."""
    return dg.AssetKey([PREFIX, name])


def group(name: str) -> str:
    """The use case's asset group ``name``: ``flights_<name>``."""
    return f"{PREFIX}_{name}"
