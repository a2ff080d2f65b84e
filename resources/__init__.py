"""Dagster resources of this deployment: storage, online store, registry, ledger, Triton, policies, Flink."""

from resources.flink import FlinkResource
from resources.ledger import LedgerResource
from resources.online_store import OnlineStoreResource
from resources.parquet_io import ParquetIOManager
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from resources.triton import TritonResource

__all__ = [
    "FlinkResource",
    "LedgerResource",
    "ModelRegistryResource",
    "OnlineStoreResource",
    "ParquetIOManager",
    "PolicyStoreResource",
    "TritonResource",
]
