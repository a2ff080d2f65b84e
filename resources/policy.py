"""The policy store as a Dagster resource ($KEEL_HOME/policies.sqlite), checking model versions against the registry."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.policy import PolicyStore
from keel.registry import versions_lookup
from resources.parquet_io import keel_home


class PolicyStoreResource(dg.ConfigurableResource):
    path: str | None = None
    registry_root: str | None = None

    def open(self) -> PolicyStore:
        registry_root = Path(self.registry_root) if self.registry_root else keel_home() / "registry"
        return PolicyStore(
            Path(self.path) if self.path else keel_home() / "policies.sqlite",
            versions_of=versions_lookup(registry_root),
        )
