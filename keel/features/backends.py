"""Which online store a process opens: one setting for every process of a deployment.

``KEEL_ONLINE_STORE`` unset (or ``sqlite``): the embedded SQLite store under ``$KEEL_HOME/online`` — the default of
the README's main command. ``redis://host:port/db``: the Redis store (keel/features/redis_store.py), shared by every
gateway and run; ``KEEL_ONLINE_PREFIX`` names its key prefix (default ``keel:online``), ``KEEL_REDIS_PASSWORD`` its
password. The gateway, the Dagster resource, the sensors and ``keel`` commands all open the store through here.
"""

from __future__ import annotations

import os
from pathlib import Path

from keel.features.online import OnlineStore, OnlineStoreError
from keel.features.spec import FeatureSet

ENV = "KEEL_ONLINE_STORE"


def online_store_url() -> str | None:
    """The Redis URL the environment selects, or None for the embedded SQLite store."""
    value = (os.environ.get(ENV) or "").strip()
    if value in ("", "sqlite"):
        return None
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise OnlineStoreError(f"{ENV} must be sqlite or a redis:// URL, got {value.split('@')[-1]!r}")
    return value


def describe(sqlite_path: Path) -> str:
    """Where the selected store is, for logs and the UI (never a password)."""
    url = online_store_url()
    if url is None:
        return str(sqlite_path)
    return f"{url.split('@')[-1]} ({os.environ.get('KEEL_ONLINE_PREFIX') or 'keel:online'})"


def open_online_store(sqlite_path: Path, *, features: FeatureSet, cache_size: int = 0) -> OnlineStore:
    """The store of ``features`` the environment selects; ``sqlite_path`` is the embedded one's file."""
    url = online_store_url()
    if url is None:
        from keel.features.sqlite_store import SQLiteOnlineStore

        return SQLiteOnlineStore(sqlite_path, features=features, cache_size=cache_size)
    from keel.features.redis_store import DEFAULT_PREFIX, RedisOnlineStore

    return RedisOnlineStore(url, features=features, prefix=os.environ.get("KEEL_ONLINE_PREFIX") or DEFAULT_PREFIX)
