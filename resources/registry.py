"""The model registry as a Dagster resource (under $KEEL_HOME/registry by default)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from keel.registry import ModelRegistry
from resources.parquet_io import keel_home


class ModelRegistryResource(dg.ConfigurableResource):
    root: str | None = None

    def open(self) -> ModelRegistry:
        return ModelRegistry(Path(self.root) if self.root else keel_home() / "registry")
