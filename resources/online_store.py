"""The online feature store as a Dagster resource (embedded SQLite by default, under $KEEL_HOME/online)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.features.sqlite_store import SQLiteOnlineStore
from keel.home import KeelHome


class OnlineStoreResource(dg.ConfigurableResource):
    """Opens the SQLite online store. ``path`` defaults to ``$KEEL_HOME/online/features.sqlite``."""

    path: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def store_path(self) -> Path:
        return Path(self.path) if self.path else KeelHome.of(self.home).online_store

    def open(self) -> SQLiteOnlineStore:
        return SQLiteOnlineStore(self.store_path())
