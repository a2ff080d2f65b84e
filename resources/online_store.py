"""The online feature store as a Dagster resource: embedded SQLite under $KEEL_HOME/online by default, the shared
Redis store when ``KEEL_ONLINE_STORE`` is a redis:// URL (keel/features/backends.py)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.features.backends import describe, open_online_store
from keel.features.online import OnlineStore
from keel.features.spec import FeatureSet
from keel.home import KeelHome


class OnlineStoreResource(dg.ConfigurableResource):
    """Opens the online store the environment selects. ``path`` (the SQLite file) defaults to
    ``$KEEL_HOME/online/features.sqlite``."""

    path: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def store_path(self) -> Path:
        return Path(self.path) if self.path else KeelHome.of(self.home).online_store

    def open(self, features: FeatureSet | None = None) -> OnlineStore:
        """The store of ``features`` (None: the installed use case's)."""
        from keel.usecase import only

        return open_online_store(self.store_path(), features=features or only().features)

    def shown(self) -> str:
        """Where the store is, as the UI shows it (``$KEEL_HOME/...`` for the file, host and prefix for Redis)."""
        path = self.store_path()
        shown = describe(path)
        return KeelHome.of(self.home).shown(path) if shown == str(path) else shown
