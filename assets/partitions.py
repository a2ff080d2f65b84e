"""Partitions shared by the time-based assets: one per month of 2013, keyed ``YYYY-MM``; and the cadence they
are expected on."""

from datetime import timedelta

import dagster as dg

monthly_2013 = dg.MonthlyPartitionsDefinition(start_date="2013-01", end_date="2014-01", fmt="%Y-%m")

# Flights and weather are delivered once a month: an asset on that cadence warns when a month passes without a new
# materialization and fails a few days later (the UI's freshness status; Dagster's freshness daemon judges it).
MONTHLY_CADENCE = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=35), warn_window=timedelta(days=32))
