"""Dagster resources of this deployment: storage, online store, registry, ledger, Triton, policies, Flink.

``keel_resources(home)`` is the one list of them: definitions.py passes ``dg.EnvVar("KEEL_HOME")`` (the UI shows
which variable configures them; scripts/env.sh sets it), tests pass a temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resources.flink import FlinkResource
from resources.home import KeelHomeResource
from resources.ledger import LedgerResource
from resources.online_store import OnlineStoreResource
from resources.parquet_io import ParquetIOManager
from resources.policy import PolicyStoreResource
from resources.pools import MemoryPoolsResource
from resources.registry import ModelRegistryResource
from resources.triton import TritonResource


def keel_resources(home: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Every resource the definitions use, all on one KEEL_HOME (``None``: ``$KEEL_HOME`` read when used).
    ``overrides`` replace single entries (a Triton with a fault file, a Flink interpreter)."""
    h = str(home) if isinstance(home, Path) else home
    return {
        "io_manager": ParquetIOManager(home=h),
        "online_store": OnlineStoreResource(home=h),
        "registry": ModelRegistryResource(home=h),
        "ledger": LedgerResource(home=h),
        "triton": TritonResource(home=h),
        "policies": PolicyStoreResource(home=h),
        "flink": FlinkResource(),
        "keel_home": KeelHomeResource(home=h),
        "memory_pools": MemoryPoolsResource(),
    } | overrides


__all__ = [
    "FlinkResource",
    "KeelHomeResource",
    "LedgerResource",
    "MemoryPoolsResource",
    "ModelRegistryResource",
    "OnlineStoreResource",
    "ParquetIOManager",
    "PolicyStoreResource",
    "TritonResource",
    "keel_resources",
]
