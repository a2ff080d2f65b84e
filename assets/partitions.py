"""The cadence time-partitioned assets are expected on. (Each use case's monthly partitions are its own:
assets/usecase.py ``Wiring.monthly``, over its declared period.)"""

from datetime import timedelta

import dagster as dg

# Monthly deliveries: an asset on that cadence warns when a month passes without a new materialization and fails a
# few days later (the UI's freshness status; Dagster's freshness daemon judges it).
MONTHLY_CADENCE = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=35), warn_window=timedelta(days=32))
