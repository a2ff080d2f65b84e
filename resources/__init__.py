"""Dagster resources of this deployment: storage now; online store, registry, policy store and Triton later."""

from resources.ledger import LedgerResource
from resources.online_store import OnlineStoreResource
from resources.parquet_io import ParquetIOManager, keel_home
from resources.registry import ModelRegistryResource

__all__ = ["LedgerResource", "ModelRegistryResource", "OnlineStoreResource", "ParquetIOManager", "keel_home"]
