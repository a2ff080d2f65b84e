"""The model registry as a Dagster resource (under $KEEL_HOME/registry by default)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.home import KeelHome
from keel.registry import ModelRegistry


class ModelRegistryResource(dg.ConfigurableResource):
    root: str | None = None
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def open(self) -> ModelRegistry:
        return ModelRegistry(Path(self.root) if self.root else KeelHome.of(self.home).registry)
