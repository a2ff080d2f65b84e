"""The online feature store as a Dagster resource: embedded SQLite under $KEEL_HOME/online by default, the shared
Redis store when ``KEEL_ONLINE_STORE`` is a redis:// URL (keel/features/backends.py)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.features.backends import describe, open_online_store
from keel.features.online import OnlineStore
from keel.home import KeelHome
from keel.usecase import UseCase


class OnlineStoreResource(dg.ConfigurableResource):
    """Opens the online store the environment selects. ``path`` (the SQLite file) defaults to the use case's,
    ``$KEEL_HOME/online/<use case>.sqlite``."""

    path: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def store_path(self, usecase: UseCase) -> Path:
        return Path(self.path) if self.path else KeelHome.of(self.home).online_store_of(usecase.name)

    def open(self, usecase: UseCase) -> OnlineStore:
        """The online store of ``usecase`` (its features)."""
        return open_online_store(self.store_path(usecase), features=usecase.features)

    def shown(self, usecase: UseCase) -> str:
        """Where the store is, as the UI shows it (``$KEEL_HOME/...`` for the file, host and prefix for Redis)."""
        path = self.store_path(usecase)
        shown = describe(path)
        return KeelHome.of(self.home).shown(path) if shown == str(path) else shown
