"""Dagster resources of this deployment: storage, online store, registry, ledger, Triton."""

from resources.ledger import LedgerResource
from resources.online_store import OnlineStoreResource
from resources.parquet_io import ParquetIOManager, keel_home
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from resources.triton import TritonResource

__all__ = [
    "LedgerResource",
    "ModelRegistryResource",
    "OnlineStoreResource",
    "ParquetIOManager",
    "PolicyStoreResource",
    "TritonResource",
    "keel_home",
]
