"""The release ledger as a Dagster resource ($KEEL_HOME/ledger.sqlite by default)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.ledger import Ledger
from resources.parquet_io import keel_home


class LedgerResource(dg.ConfigurableResource):
    path: str | None = None

    def open(self) -> Ledger:
        return Ledger(Path(self.path) if self.path else keel_home() / "ledger.sqlite")
