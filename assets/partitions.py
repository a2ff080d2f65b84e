"""The cadence time-partitioned assets are expected on. (Each use case's monthly partitions are its own:
assets/usecase.py ``Wiring.monthly``, over its declared period.)"""

import os
from datetime import timedelta

import dagster as dg

# Monthly deliveries: an asset on that cadence warns when a month passes without a new materialization and fails a
# few days later (the UI's freshness status; Dagster's freshness daemon judges it).
MONTHLY_CADENCE = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=35), warn_window=timedelta(days=32))
REPLAY_ENV = "KEEL_REPLAY"  # "1": this deployment replays a period that already happened (scripts/up sets it)


def monthly_cadence() -> dg.FreshnessPolicy | None:
    """``MONTHLY_CADENCE`` — except on a home that replays a past period (``KEEL_REPLAY=1``: scripts/up's live
    replay and backfill of 2013 or 2016 data). Dagster judges freshness on the wall clock: a replayed year, done in
    an afternoon, would turn every monthly asset red five weeks later though nothing is late (docs/ui.md)."""
    return None if os.environ.get(REPLAY_ENV) == "1" else MONTHLY_CADENCE
