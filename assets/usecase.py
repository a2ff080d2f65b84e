"""How a use case (keel/usecase.py) becomes Dagster names: its asset keys live under its name (``flights/…``), its
asset groups carry it (``flights_raw``, …) and its time-partitioned assets share one monthly partitioning over its
period — so another use case's assets never collide with them.

The asset factories (assets/raw.py, validated.py, features.py, models.py, deployment.py) take a ``UseCase`` and
build its assets through ``wiring(uc)``; assets/pipeline.py puts them together per use case.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

import dagster as dg

from keel.usecase import UseCase


@dataclass(frozen=True, eq=False)
class Wiring:
    uc: UseCase

    @property
    def prefix(self) -> str:
        return self.uc.name

    def key(self, name: str) -> dg.AssetKey:
        """The use case's asset ``name``: ``<use case>/<name>``."""
        return dg.AssetKey([self.uc.name, name])

    def group(self, name: str) -> str:
        """The use case's asset group ``name``: ``<use case>_<name>``."""
        return f"{self.uc.name}_{name}"

    def op(self, name: str) -> str:
        """An op or job name of the use case: ``<use case>__<name>`` (op names cannot hold ``/``)."""
        return f"{self.uc.name}__{name}"

    @cached_property
    def monthly(self) -> dg.MonthlyPartitionsDefinition:
        """One partition per month of the use case's period, keyed ``YYYY-MM``."""
        months = self.uc.months
        if not months:
            raise ValueError(f"use case {self.uc.name} declares no period: its tables cannot be partitioned by month")
        y, m = (int(x) for x in months[-1].split("-"))
        end = f"{y + (m == 12)}-{m % 12 + 1:02d}"
        return dg.MonthlyPartitionsDefinition(start_date=months[0], end_date=end, fmt="%Y-%m")


@cache
def wiring(uc: UseCase) -> Wiring:
    return Wiring(uc)
