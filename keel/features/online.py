"""The online path: an online store with the latest values per entity, read by ``get_online_features``.

``OnlineStore`` is the interface; ``SQLiteOnlineStore`` is the embedded default (WAL mode, synchronous=FULL, one
transaction per snapshot, so a reader sees the previous snapshot or the new one, never half). A Redis store would
implement the same four methods.

A snapshot is written *as of* a day: delay-rate counters over flights before that day, the hourly weather
observations and the planes. ``get_online_features`` then runs the same definitions as the offline path
(keel.features.definitions) on the looked-up values, so the two paths agree for the same inputs — the skew check
and tests/features/test_parity.py hold them to it.

Frozen features (``freeze``) are served with the value recorded at the freeze (the reference default unless
given) and the response lists them under ``degraded``; freezes and unfreezes are kept in ``freeze_log``.
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import polars as pl

from keel.errors import KeelError
from keel.features.definitions import (
    BY_NAME,
    FEATURE_NAMES,
    HISTORY_VIEWS,
    WEATHER_COLUMNS,
    daily_outcomes,
    entity_frame,
    plane_features_expr,
    plane_table,
    request_expressions,
    smoothed_rate,
)

REQUEST_COLUMNS = ("carrier", "origin", "dest", "tailnum", "sched_date", "hour", "time_hour", "distance")


class OnlineStoreError(KeelError):
    """The online store cannot be read or written."""


@dataclass(frozen=True)
class StoreHealth:
    reachable: bool
    last_write_at: datetime | None
    as_of: date | None
    rows_per_view: dict[str, int]
    error: str | None = None


@dataclass(frozen=True)
class FreezeEvent:
    feature: str
    action: str  # freeze | unfreeze
    reason: str
    at: datetime
    value: float | None


class OnlineStore(ABC):
    @abstractmethod
    def write_snapshot(self, views: Mapping[str, pl.DataFrame], *, as_of: date, partition: str) -> None: ...

    @abstractmethod
    def lookup(self, view: str, keys: list[str]) -> dict[str, dict[str, Any]]: ...

    @abstractmethod
    def health(self) -> StoreHealth: ...

    @abstractmethod
    def frozen(self) -> dict[str, float]: ...

    def get_online_features(self, entity_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return get_online_features(self, entity_rows)


def _key(*parts: Any) -> str:
    return "|".join(
        "" if p is None else (p.isoformat() if isinstance(p, (date, datetime)) else str(p)) for p in parts
    )


def build_views(
    weather: pl.DataFrame, planes_raw: pl.DataFrame, history: pl.DataFrame, *, as_of: date
) -> dict[str, pl.DataFrame]:
    """The entity tables of a snapshot, each as (key, values-as-JSON) rows, from the same definitions as offline."""
    hist = entity_frame(history) if "sched_date" not in history.columns else history
    hist = hist.filter(pl.col("sched_date") < as_of)
    views: dict[str, pl.DataFrame] = {}
    for view in HISTORY_VIEWS:
        totals = (
            daily_outcomes(hist, view)
            .group_by(list(view.keys))
            .agg(pl.col("n").sum().alias("n_cum"), pl.col("late").sum().alias("late_cum"))
        )
        views[view.feature] = totals.select(
            pl.concat_str([pl.col(k).cast(pl.String) for k in view.keys], separator="|").alias("key"),
            pl.struct("n_cum", "late_cum").struct.json_encode().alias("values"),
        )
    w = weather.unique(["origin", "time_hour"], keep="first")
    views["weather"] = w.select(
        pl.concat_str(
            [pl.col("origin"), pl.col("time_hour").dt.strftime("%Y-%m-%dT%H:%M:%S+00:00")], separator="|"
        ).alias("key"),
        pl.struct(list(WEATHER_COLUMNS)).struct.json_encode().alias("values"),
    )
    p = plane_table(planes_raw)
    views["plane"] = p.select(
        pl.col("tailnum").alias("key"), pl.struct("plane_year", "seats").struct.json_encode().alias("values")
    )
    return views


class SQLiteOnlineStore(OnlineStore):
    """SQLite in WAL mode; one connection per instance (make one per thread)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(
                """
                CREATE TABLE IF NOT EXISTS entity_values (view TEXT NOT NULL, key TEXT NOT NULL, "values" TEXT NOT NULL,
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
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for view, frame in views.items():
                self._db.execute("DELETE FROM entity_values WHERE view = ?", (view,))
                self._db.executemany(
                    'INSERT INTO entity_values (view, key, "values") VALUES (?, ?, ?)',
                    ((view, k, v) for k, v in frame.select("key", "values").iter_rows()),
                )
            for k, v in (("last_write_at", now), ("as_of", as_of.isoformat()), ("partition", partition)):
                self._db.execute(
                    "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (k, v)
                )
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def lookup(self, view: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        if not keys:
            return {}
        unique = list(dict.fromkeys(keys))
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(unique), 500):  # stay under SQLite's bound-parameter limit
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f'SELECT key, "values" FROM entity_values WHERE view = ? AND key IN ({marks})', (view, *chunk)
            )  # noqa: S608 - only placeholders
            out.update((k, json.loads(v)) for k, v in rows)
        return out

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
    def freeze(self, feature: str, reason: str, value: float | None = None) -> None:
        if feature not in BY_NAME:
            raise KeyError(f"unknown feature '{feature}'")
        value = BY_NAME[feature].default if value is None else value
        now = datetime.now(UTC).isoformat()
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute(
            "INSERT INTO freezes (feature, value, reason, frozen_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(feature) DO UPDATE SET value = excluded.value, reason = excluded.reason, frozen_at = excluded.frozen_at",
            (feature, value, reason, now),
        )
        self._db.execute(
            "INSERT INTO freeze_log (feature, action, reason, at, value) VALUES (?, 'freeze', ?, ?, ?)",
            (feature, reason, now, value),
        )
        self._db.execute("COMMIT")

    def unfreeze(self, feature: str, reason: str) -> None:
        now = datetime.now(UTC).isoformat()
        self._db.execute("BEGIN IMMEDIATE")
        deleted = self._db.execute("DELETE FROM freezes WHERE feature = ?", (feature,)).rowcount
        if deleted:
            self._db.execute(
                "INSERT INTO freeze_log (feature, action, reason, at, value) VALUES (?, 'unfreeze', ?, ?, NULL)",
                (feature, reason, now),
            )
        self._db.execute("COMMIT")

    def frozen(self) -> dict[str, float]:
        return dict(self._db.execute("SELECT feature, value FROM freezes"))

    def freeze_log(self) -> list[FreezeEvent]:
        rows = self._db.execute("SELECT feature, action, reason, at, value FROM freeze_log ORDER BY id")
        return [FreezeEvent(f, a, r, datetime.fromisoformat(t), v) for f, a, r, t, v in rows]


def _as_date(v: Any) -> date:
    if isinstance(v, datetime):
        return v.date()
    if isinstance(v, date):
        return v
    return date.fromisoformat(str(v))


def _as_hour(v: Any) -> datetime:
    dt = v if isinstance(v, datetime) else datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    return (dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)).replace(
        minute=0, second=0, microsecond=0
    )


def get_online_features(store: OnlineStore, entity_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Feature vectors for flights being scheduled: ``carrier, origin, dest, tailnum, sched_date, hour, time_hour,
    distance`` per row. Each result has every feature, ``degraded`` (frozen features served with their freeze value)
    and ``missing`` (features with no value in the store, served as null)."""
    rows = list(entity_rows)
    if not rows:
        return []
    absent = [c for c in REQUEST_COLUMNS if c not in rows[0]]
    if absent:
        raise ValueError(f"entity rows need {', '.join(REQUEST_COLUMNS)}; missing {', '.join(absent)}")
    dates = [_as_date(r["sched_date"]) for r in rows]
    hours = [_as_hour(r["time_hour"]) for r in rows]
    weather = store.lookup("weather", [_key(r["origin"], h) for r, h in zip(rows, hours, strict=True)])
    planes = store.lookup("plane", [str(r["tailnum"]) for r in rows])
    rates = {v.feature: store.lookup(v.feature, [_key(*(r[k] for k in v.keys)) for r in rows]) for v in HISTORY_VIEWS}
    columns: dict[str, list[Any]] = {
        c: [r[c] for r in rows] for c in ("carrier", "origin", "dest", "tailnum", "hour", "distance")
    }
    columns["sched_date"] = dates
    for name in WEATHER_COLUMNS:
        columns[name] = [weather.get(_key(r["origin"], h), {}).get(name) for r, h in zip(rows, hours, strict=True)]
    columns["plane_year"] = [planes.get(str(r["tailnum"]), {}).get("plane_year") for r in rows]
    columns["seats"] = [planes.get(str(r["tailnum"]), {}).get("seats") for r in rows]
    for v in HISTORY_VIEWS:
        found = [rates[v.feature].get(_key(*(r[k] for k in v.keys)), {}) for r in rows]
        columns[f"{v.feature}__n"] = [f.get("n_cum") for f in found]
        columns[f"{v.feature}__late"] = [f.get("late_cum") for f in found]
    frame = pl.DataFrame(
        columns,
        schema_overrides={
            "hour": pl.Int64,
            "distance": pl.Float64,
            "sched_date": pl.Date,
            "plane_year": pl.Float64,
            "seats": pl.Float64,
            **{n: pl.Float64 for n in WEATHER_COLUMNS},
            **{f"{v.feature}__{s}": pl.Int64 for v in HISTORY_VIEWS for s in ("n", "late")},
        },
    )
    frame = frame.with_columns(
        *request_expressions(),
        *plane_features_expr(),
        *[
            smoothed_rate(pl.col(f"{v.feature}__late"), pl.col(f"{v.feature}__n")).alias(v.feature)
            for v in HISTORY_VIEWS
        ],
    )
    frozen = store.frozen()
    out = []
    for values in frame.select(FEATURE_NAMES).iter_rows(named=True):
        degraded = []
        for feature, value in frozen.items():
            values[feature] = value
            degraded.append(feature)
        values["missing"] = [n for n in FEATURE_NAMES if values[n] is None]
        values["degraded"] = degraded
        out.append(values)
    return out
