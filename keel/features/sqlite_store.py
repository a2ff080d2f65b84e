"""The embedded online store: SQLite in WAL mode with synchronous=FULL, one transaction per snapshot, so a reader
sees the previous snapshot or the new one, never half of one; freezes and their log in the same file."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import polars as pl

from keel.features.online import (
    MAX_FIELDS,
    FreezeEvent,
    OnlineStore,
    OnlineStoreError,
    StoreHealth,
    check_views_fit,
)
from keel.features.spec import FeatureSet
from keel.storage import immediate

_MISS = object()


class SQLiteOnlineStore(OnlineStore):
    """SQLite in WAL mode; one connection per instance (make one per thread).

    ``cache_size`` > 0 keeps values read from the current snapshot in process (a serving process reads the same
    keys over and over); the cache is keyed to the snapshot's write time, so a new snapshot
    written by any process empties it on the next read. 0 reads every key from SQLite.
    """

    def __init__(self, path: str | Path, *, features: FeatureSet, cache_size: int = 0):
        check_views_fit(features)
        self.features = features
        self.path = Path(path)
        self.cache_size = cache_size
        self._cache: dict[tuple[str, str], tuple | None] = {}
        self._cache_snapshot: str | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(entity_values)")}
            if columns and "v0" not in columns:
                # A store written by an older keel (values as JSON): entity values are derived data that the next
                # snapshot rewrites, so the table is recreated; freezes and their log are kept.
                self._db.execute("DROP TABLE entity_values")
            self._db.executescript(
                """
                CREATE TABLE IF NOT EXISTS entity_values (view TEXT NOT NULL, key TEXT NOT NULL,
                                                          v0 REAL, v1 REAL, v2 REAL, v3 REAL, v4 REAL,
                                                          PRIMARY KEY (view, key)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS freezes (feature TEXT PRIMARY KEY, value REAL, reason TEXT NOT NULL, frozen_at TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS freeze_log (id INTEGER PRIMARY KEY AUTOINCREMENT, feature TEXT NOT NULL, action TEXT NOT NULL,
                                                       reason TEXT NOT NULL, at TEXT NOT NULL, value REAL);
                """
            )
        except sqlite3.Error as exc:
            raise OnlineStoreError(f"online store {self.path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def write_snapshot(self, views: Mapping[str, pl.DataFrame], *, as_of: date, partition: str) -> None:
        now = datetime.now(UTC).isoformat()
        with immediate(self._db):
            for view, frame in views.items():
                self._db.execute("DELETE FROM entity_values WHERE view = ?", (view,))
                fields = self.features.view_fields[view]
                pad = (None,) * (MAX_FIELDS - len(fields))
                self._db.executemany(
                    "INSERT INTO entity_values (view, key, v0, v1, v2, v3, v4) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    ((view, *row, *pad) for row in frame.select("key", *fields).iter_rows()),
                )
            for k, v in (("last_write_at", now), ("as_of", as_of.isoformat()), ("partition", partition)):
                self._db.execute(
                    "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (k, v)
                )

    def lookup(self, view: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        if not keys:
            return {}
        unique = list(dict.fromkeys(keys))
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(unique), 500):  # stay under SQLite's bound-parameter limit
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT key, v0, v1, v2, v3, v4 FROM entity_values WHERE view = ? AND key IN ({marks})",
                (view, *chunk),
            )  # noqa: S608 - only placeholders
            fields = self.features.view_fields[view]
            out.update((k, dict(zip(fields, values, strict=False))) for k, *values in rows)
        return out

    def lookup_many(self, requests: Mapping[str, list[str]]) -> dict[str, dict[str, tuple]]:
        """All views in one query. With a cache, keys already read from the current snapshot are not read again."""
        out: dict[str, dict[str, tuple]] = {view: {} for view in requests}
        cache = self._cache_for_snapshot() if self.cache_size else None
        parts, params = [], []
        for view, keys in requests.items():
            unique = list(dict.fromkeys(keys))
            if cache is not None:
                misses = []
                for key in unique:
                    hit = cache.get((view, key), _MISS)
                    if hit is _MISS:
                        misses.append(key)
                    elif hit is not None:
                        out[view][key] = hit
                unique = misses
            if not unique:
                continue
            if len(params) + len(unique) > 30_000:  # SQLite's bound-parameter limit: one view at a time
                return super().lookup_many(requests)
            parts.append(
                f"SELECT view, key, v0, v1, v2, v3, v4 FROM entity_values WHERE view = ? AND key IN ({','.join('?' * len(unique))})"
            )
            params.extend([view, *unique])
            if cache is not None:
                for key in unique:
                    cache[(view, key)] = None  # remembered as absent unless the query finds it
        if parts:
            widths = {view: 2 + len(self.features.view_fields[view]) for view in requests}
            for row in self._db.execute(" UNION ALL ".join(parts), params).fetchall():  # noqa: S608 - only placeholders
                values = row[2 : widths[row[0]]]
                out[row[0]][row[1]] = values
                if cache is not None:
                    cache[(row[0], row[1])] = values
        return out

    def _cache_for_snapshot(self) -> dict[tuple[str, str], tuple | None]:
        """The read cache, emptied whenever a new snapshot has been written (by any process) or it is full."""
        row = self._db.execute("SELECT v FROM meta WHERE k = 'last_write_at'").fetchone()
        snapshot = row[0] if row else None
        if snapshot != self._cache_snapshot or len(self._cache) >= self.cache_size:
            self._cache = {}
            self._cache_snapshot = snapshot
        return self._cache

    def health(self) -> StoreHealth:
        try:
            meta = dict(self._db.execute("SELECT k, v FROM meta"))
            counts = dict(self._db.execute("SELECT view, count(*) FROM entity_values GROUP BY view"))
        except sqlite3.Error as exc:
            return StoreHealth(False, None, None, {}, str(exc))
        return StoreHealth(
            reachable=True,
            last_write_at=datetime.fromisoformat(meta["last_write_at"]) if "last_write_at" in meta else None,
            as_of=date.fromisoformat(meta["as_of"]) if "as_of" in meta else None,
            rows_per_view=counts,
        )

    # -- freezes
    def freeze(self, feature: str, reason: str, value: float | None = None, at: datetime | None = None) -> None:
        default = self.feature_default(feature)  # an unknown feature is an error even with a value
        value = default if value is None else value
        now = (at or datetime.now(UTC)).isoformat()
        with immediate(self._db):
            self._db.execute(
                "INSERT INTO freezes (feature, value, reason, frozen_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(feature) DO UPDATE SET value = excluded.value, reason = excluded.reason, frozen_at = excluded.frozen_at",
                (feature, value, reason, now),
            )
            self._db.execute(
                "INSERT INTO freeze_log (feature, action, reason, at, value) VALUES (?, 'freeze', ?, ?, ?)",
                (feature, reason, now, value),
            )

    def unfreeze(self, feature: str, reason: str, at: datetime | None = None) -> None:
        now = (at or datetime.now(UTC)).isoformat()
        with immediate(self._db):
            deleted = self._db.execute("DELETE FROM freezes WHERE feature = ?", (feature,)).rowcount
            if deleted:
                self._db.execute(
                    "INSERT INTO freeze_log (feature, action, reason, at, value) VALUES (?, 'unfreeze', ?, ?, NULL)",
                    (feature, reason, now),
                )

    def frozen(self) -> dict[str, float]:
        return dict(self._db.execute("SELECT feature, value FROM freezes"))

    def freeze_log(self) -> list[FreezeEvent]:
        rows = self._db.execute("SELECT feature, action, reason, at, value FROM freeze_log ORDER BY id")
        return [FreezeEvent(f, a, r, datetime.fromisoformat(t), v) for f, a, r, t, v in rows]
