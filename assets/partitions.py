"""Partitions shared by the time-based assets: one per month of 2013, keyed ``YYYY-MM``."""

import dagster as dg

monthly_2013 = dg.MonthlyPartitionsDefinition(start_date="2013-01", end_date="2014-01", fmt="%Y-%m")
