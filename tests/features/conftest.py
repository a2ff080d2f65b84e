from __future__ import annotations

import uuid
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from tests import CONTRACTS
from usecases.flights.data import read_raw, read_raw_month
from usecases.flights.features import FLIGHT_FEATURES


def validated_months(months: tuple[str, ...]) -> dict[str, pl.DataFrame]:
    """Validated flights and weather of ``months``, as the pipeline produces them, and the planes."""
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    out = {}
    for table in ("flights", "weather"):
        compiled = CompiledContract(load_contract(CONTRACTS / f"{table}.yaml"))
        out[table] = pl.concat([compiled.validate(read_raw_month(table, m), references=refs).valid for m in months])
    out["planes"] = read_raw("planes")
    return out


@pytest.fixture(scope="session")
def validated():
    """Validated flights and weather for 2013-01 and 2013-02, as the pipeline produces them."""
    return validated_months(("2013-01", "2013-02"))


BACKENDS = ("sqlite", "redis")  # the online store's backends; the parity tests run against each
REDIS_URL = "redis://127.0.0.1:6379/0"  # the machine's Redis service (started before every session and CI run)


@contextmanager
def online_store(kind: str, directory: Path):
    """A fresh, empty online store of ``kind``: a SQLite file in ``directory``, or a key prefix of its own on the
    real Redis server (deleted afterwards)."""
    if kind == "sqlite":
        from keel.features.sqlite_store import SQLiteOnlineStore

        store = SQLiteOnlineStore(directory / "features.sqlite", features=FLIGHT_FEATURES)
        try:
            yield store
        finally:
            store.close()
        return
    from keel.features.redis_store import RedisOnlineStore

    store = RedisOnlineStore(REDIS_URL, features=FLIGHT_FEATURES, prefix=f"keel-test:{uuid.uuid4().hex}")
    try:
        yield store
    finally:
        store.drop()
        store.close()
