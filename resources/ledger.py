"""The release ledger as a Dagster resource ($KEEL_HOME/ledger.sqlite by default)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.home import KeelHome
from keel.ledger import Ledger


class LedgerResource(dg.ConfigurableResource):
    path: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def open(self) -> Ledger:
        return Ledger(Path(self.path) if self.path else KeelHome.of(self.home).ledger)
