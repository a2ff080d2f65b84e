"""The online path: an online store with the latest values per entity, read by ``get_online_features``.

``OnlineStore`` is the interface; ``SQLiteOnlineStore`` (keel/features/sqlite_store.py) is the embedded default (WAL mode, synchronous=FULL, one
transaction per snapshot, so a reader sees the previous snapshot or the new one, never half). A Redis store would
implement the same four methods.

A snapshot is written *as of* a day: delay-rate counters over flights before that day, the hourly weather
observations and the planes. ``get_online_features`` then runs the same definitions as the offline path
(keel.features.definitions, evaluated with numpy) on the looked-up values, so the two paths agree for the same inputs — the skew check
and tests/features/test_parity.py hold them to it.

Frozen features (``freeze``) are served with the value recorded at the freeze (the reference default unless
given) and the response lists them under ``degraded``; freezes and unfreezes are kept in ``freeze_log``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl

from keel.errors import KeelError
from keel.features.definitions import (
    FEATURE_NAMES,
    FEATURES,
    HISTORY_VIEWS,
    WEATHER_COLUMNS,
    NumpyOps,
    daily_outcomes,
    entity_frame,
    plane_features,
    plane_table,
    request_features,
    smoothed_rate,
)
from keel.storage import Closing

REQUEST_COLUMNS = ("carrier", "origin", "dest", "tailnum", "sched_date", "hour", "time_hour", "distance")
# The values each view stores per key (as REAL columns v0…v4 of entity_values).
VIEW_FIELDS: dict[str, tuple[str, ...]] = {
    "weather": WEATHER_COLUMNS,
    "plane": ("plane_year", "seats"),
    **{v.feature: ("n_cum", "late_cum") for v in HISTORY_VIEWS},
}
MAX_FIELDS = 5


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


class OnlineStore(Closing, ABC):
    """What serving and the drift sensor need of an online store: snapshots in, lookups out, and freezes (a feature
    frozen is served at a fixed value, flagged degraded). ``with store:`` closes it."""

    @abstractmethod
    def write_snapshot(self, views: Mapping[str, pl.DataFrame], *, as_of: date, partition: str) -> None: ...

    @abstractmethod
    def lookup(self, view: str, keys: list[str]) -> dict[str, dict[str, Any]]: ...

    def lookup_many(self, requests: Mapping[str, list[str]]) -> dict[str, dict[str, tuple]]:
        """Several views at once, each key's values as a tuple in VIEW_FIELDS order; stores override it with a
        single round trip."""
        out = {}
        for view, keys in requests.items():
            fields = VIEW_FIELDS[view]
            out[view] = {k: tuple(v.get(f) for f in fields) for k, v in self.lookup(view, keys).items()}
        return out

    @abstractmethod
    def health(self) -> StoreHealth: ...

    @abstractmethod
    def frozen(self) -> dict[str, float]: ...

    @abstractmethod
    def freeze(self, feature: str, reason: str, value: float | None = None) -> None: ...

    @abstractmethod
    def unfreeze(self, feature: str, reason: str) -> None: ...

    @abstractmethod
    def freeze_log(self) -> list[FreezeEvent]: ...

    @abstractmethod
    def close(self) -> None: ...

    def get_online_features(self, entity_rows: Iterable[Mapping[str, Any]]) -> FeatureBatch:
        return get_online_features(self, entity_rows)


def build_views(
    weather: pl.DataFrame, planes_raw: pl.DataFrame, history: pl.DataFrame, *, as_of: date
) -> dict[str, pl.DataFrame]:
    """The entity tables of a snapshot, each as a ``key`` column plus the view's fields (VIEW_FIELDS), computed with
    the same definitions as the offline path."""
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
            pl.col("n_cum").cast(pl.Float64),
            pl.col("late_cum").cast(pl.Float64),
        )
    w = weather.unique(["origin", "time_hour"], keep="first")
    views["weather"] = w.select(
        pl.concat_str(
            [pl.col("origin"), pl.col("time_hour").dt.strftime("%Y-%m-%dT%H:%M:%S+00:00")], separator="|"
        ).alias("key"),
        *[pl.col(c).cast(pl.Float64) for c in WEATHER_COLUMNS],
    )
    p = plane_table(planes_raw)
    views["plane"] = p.select(pl.col("tailnum").alias("key"), pl.col("plane_year"), pl.col("seats"))
    return views


def _as_date(v: Any) -> date:
    if isinstance(v, datetime):
        return v.date()
    if isinstance(v, date):
        return v
    return date.fromisoformat(str(v))


@lru_cache(maxsize=4096)
def _hour_key(v: Any) -> str:
    """The weather view's time part of a key: the UTC hour, as build_views writes it."""
    dt = v if isinstance(v, datetime) else datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    if dt.tzinfo is not None and dt.utcoffset():
        dt = dt.astimezone(UTC)
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:00:00+00:00"


_NO_COUNTS = (None, None)


def _entity_key(row: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return str(row[keys[0]]) if len(keys) == 1 else "|".join([str(row[k]) for k in keys])


_INT_FEATURES = {f.name for f in FEATURES if f.dtype == pl.Int32}


def get_online_features(store: OnlineStore, entity_rows: Iterable[Mapping[str, Any]]) -> FeatureBatch:
    """Feature vectors for flights being scheduled: ``carrier, origin, dest, tailnum, sched_date, hour, time_hour,
    distance`` per row. Each result has every feature, ``degraded`` (frozen features served with their freeze value)
    and ``missing`` (features with no value in the store, served as null)."""
    rows = list(entity_rows)
    if not rows:
        return FeatureBatch(np.empty((len(FEATURE_NAMES), 0)), np.empty((len(FEATURE_NAMES), 0), dtype=bool), ())
    absent = [c for c in REQUEST_COLUMNS if c not in rows[0]]
    if absent:
        raise ValueError(f"entity rows need {', '.join(REQUEST_COLUMNS)}; missing {', '.join(absent)}")
    keys = {
        "weather": [f"{r['origin']}|{_hour_key(r['time_hour'])}" for r in rows],
        "plane": [str(r["tailnum"]) for r in rows],
        **{v.feature: [_entity_key(r, v.keys) for r in rows] for v in HISTORY_VIEWS},
    }
    found = store.lookup_many(keys)
    n = len(rows)
    inputs: dict[str, np.ndarray] = {
        "sched_date": np.array([_as_date(r["sched_date"]) for r in rows], dtype="datetime64[D]"),
        "hour": np.array([r["hour"] for r in rows], dtype=np.float64),
        "distance": np.array([r["distance"] for r in rows], dtype=np.float64),
    }
    for view in ("weather", "plane"):
        width = len(VIEW_FIELDS[view])
        hits = np.array([found[view].get(k) or (None,) * width for k in keys[view]], dtype=np.float64).reshape(
            n, width
        )
        for i, name in enumerate(VIEW_FIELDS[view]):
            inputs[name] = hits[:, i]
    col = inputs.__getitem__
    values: dict[str, np.ndarray] = {**request_features(col, NumpyOps), **plane_features(col, NumpyOps)}
    for name in WEATHER_COLUMNS:
        values[name] = inputs[name]
    for v in HISTORY_VIEWS:
        hits = np.array([found[v.feature].get(k) or _NO_COUNTS for k in keys[v.feature]], dtype=np.float64).reshape(
            n, 2
        )
        values[v.feature] = smoothed_rate(hits[:, 1], hits[:, 0], NumpyOps)  # VIEW_FIELDS: (n_cum, late_cum)
    frozen = store.frozen()
    matrix = np.vstack([values[name] for name in FEATURE_NAMES])  # features × flights
    for name, value in frozen.items():
        matrix[FEATURE_NAMES.index(name)] = value  # served with its freeze value
    return FeatureBatch(matrix, np.isnan(matrix), tuple(frozen))


class FeatureBatch(Sequence):
    """The answer of ``get_online_features``: columnar (what a model consumes), and a sequence of per-flight dicts
    (built on first access) for everything else.

    ``matrix`` is features × flights (float64, NaN where a value is missing), in ``FEATURE_NAMES`` order.
    """

    names = FEATURE_NAMES

    def __init__(self, matrix: np.ndarray, nulls: np.ndarray, degraded: tuple[str, ...]):
        self.matrix = matrix
        self.nulls = nulls
        self.degraded = degraded
        self._rows: list[dict[str, Any]] | None = None

    def column(self, name: str) -> np.ndarray:
        return self.matrix[FEATURE_NAMES.index(name)]

    def __len__(self) -> int:
        return self.matrix.shape[1]

    def __getitem__(self, index):  # type: ignore[override]
        return self.rows()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FeatureBatch):
            other = other.rows()
        return isinstance(other, list) and self.rows() == other

    __hash__ = None  # type: ignore[assignment]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per flight: every feature (None where missing), ``missing`` and ``degraded``."""
        if self._rows is not None:
            return self._rows
        columns = []
        for i, name in enumerate(FEATURE_NAMES):
            row_nulls = self.nulls[i]
            arr = (
                np.where(row_nulls, 0.0, self.matrix[i]).astype(np.int64) if name in _INT_FEATURES else self.matrix[i]
            )
            as_list = arr.tolist()
            if row_nulls.any():
                as_list = [None if m else x for x, m in zip(as_list, row_nulls.tolist(), strict=True)]
            columns.append(as_list)
        has_null = self.nulls.any(axis=0).tolist()
        out = []
        for j, row_values in enumerate(zip(*columns, strict=True)):
            row = dict(zip(FEATURE_NAMES, row_values, strict=True))
            row["missing"] = [FEATURE_NAMES[i] for i in np.flatnonzero(self.nulls[:, j])] if has_null[j] else []
            row["degraded"] = list(self.degraded)
            out.append(row)
        self._rows = out
        return out
