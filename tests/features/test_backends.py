"""One setting selects the online store for every process: KEEL_ONLINE_STORE (keel/features/backends.py)."""

from __future__ import annotations

import pytest

from keel.features.backends import describe, open_online_store
from keel.features.online import OnlineStoreError
from keel.features.redis_store import RedisOnlineStore
from keel.features.sqlite_store import SQLiteOnlineStore
from tests.features.conftest import REDIS_URL
from usecases.flights.features import FLIGHT_FEATURES


@pytest.mark.parametrize("value", [None, "", "sqlite"])
def test_the_embedded_store_is_the_default(tmp_path, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("KEEL_ONLINE_STORE", raising=False)
    else:
        monkeypatch.setenv("KEEL_ONLINE_STORE", value)
    with open_online_store(tmp_path / "features.sqlite", features=FLIGHT_FEATURES) as store:
        assert isinstance(store, SQLiteOnlineStore) and (tmp_path / "features.sqlite").exists()
    assert describe(tmp_path / "features.sqlite") == str(tmp_path / "features.sqlite")


def test_a_redis_url_selects_the_shared_store(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_ONLINE_STORE", REDIS_URL)
    monkeypatch.setenv("KEEL_ONLINE_PREFIX", "keel-test:backends")
    with open_online_store(tmp_path / "features.sqlite", features=FLIGHT_FEATURES) as store:
        assert isinstance(store, RedisOnlineStore) and store.prefix == "keel-test:backends"
        assert store.health().reachable
    assert not (tmp_path / "features.sqlite").exists()
    monkeypatch.setenv("KEEL_ONLINE_STORE", "redis://:s3cret@127.0.0.1:6379/0")
    assert describe(tmp_path / "x") == "127.0.0.1:6379/0 (keel-test:backends)"  # never the password


def test_anything_else_is_a_clear_error_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_ONLINE_STORE", "postgres://u:s3cret@db/x")
    with pytest.raises(OnlineStoreError, match="KEEL_ONLINE_STORE must be sqlite or a redis:// URL") as err:
        open_online_store(tmp_path / "features.sqlite", features=FLIGHT_FEATURES)
    assert "s3cret" not in str(err.value)
