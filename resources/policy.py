"""The policy store as a Dagster resource ($KEEL_HOME/policies.sqlite), checking model versions against the registry."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.home import KeelHome
from keel.policies import PolicyStore
from keel.registry import versions_lookup
from keel.sqldb import location_of


class PolicyStoreResource(dg.ConfigurableResource):
    path: str | None = None
    registry_root: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def open(self) -> PolicyStore:
        registry_root = Path(self.registry_root) if self.registry_root else KeelHome.of(self.home).registry
        return PolicyStore(
            location_of(self.path) if self.path else KeelHome.of(self.home).policies,
            versions_of=versions_lookup(registry_root),
        )
