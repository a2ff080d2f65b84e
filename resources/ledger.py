"""The release ledger as a Dagster resource ($KEEL_HOME/ledger.sqlite by default)."""

from __future__ import annotations

import dagster as dg

from keel.home import KeelHome
from keel.ledger import Ledger
from keel.sqldb import location_of


class LedgerResource(dg.ConfigurableResource):
    path: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def open(self) -> Ledger:
        return Ledger(location_of(self.path) if self.path else KeelHome.of(self.home).ledger)
