"""The online path: an online store with the latest values per entity, read by ``get_online_features``.

``OnlineStore`` is the interface; ``SQLiteOnlineStore`` (keel/features/sqlite_store.py) is the embedded default (WAL
mode, synchronous=FULL, one transaction per snapshot, so a reader sees the previous snapshot or the new one, never
half) and ``RedisOnlineStore`` (keel/features/redis_store.py) the shared one. A store holds one use case's
``FeatureSet`` (keel/features/spec.py): its views are the set's lookups and histories.

A snapshot is written *as of* a day: each history's counters over rows before that day, and each lookup's table.
``get_online_features`` then runs the same declarations as the offline path (evaluated with numpy) on the looked-up
values, so the two paths agree for the same inputs — the skew check and tests/features/test_parity.py hold them to
it.

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
from keel.features.offline import daily_totals, entity_frame
from keel.features.spec import FeatureSet, FeatureSpecError, Key, NumpyOps
from keel.storage import Closing

MAX_FIELDS = 5  # values per key a store keeps (the SQLite store's v0…v4 columns)


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
    frozen is served at a fixed value, flagged degraded). ``features``: the feature set whose views it holds.
    ``with store:`` closes it."""

    features: FeatureSet

    @abstractmethod
    def write_snapshot(self, views: Mapping[str, pl.DataFrame], *, as_of: date, partition: str) -> None: ...

    @abstractmethod
    def lookup(self, view: str, keys: list[str]) -> dict[str, dict[str, Any]]: ...

    def lookup_many(self, requests: Mapping[str, list[str]]) -> dict[str, dict[str, tuple]]:
        """Several views at once, each key's values as a tuple in ``features.view_fields`` order; stores override it
        with a single round trip."""
        out = {}
        for view, keys in requests.items():
            fields = self.features.view_fields[view]
            out[view] = {k: tuple(v.get(f) for f in fields) for k, v in self.lookup(view, keys).items()}
        return out

    def feature_default(self, feature: str) -> float:
        """The reference default a freeze serves; a feature the set does not declare is an error naming it."""
        spec = self.features.by_name.get(feature)
        if spec is None:
            raise OnlineStoreError(f"unknown feature {feature!r}: the {self.features.entity.name} features are "
                                   f"{', '.join(self.features.names)}")  # fmt: skip
        return spec.default

    @abstractmethod
    def health(self) -> StoreHealth: ...

    @abstractmethod
    def frozen(self) -> dict[str, float]: ...

    @abstractmethod
    def freeze(self, feature: str, reason: str, value: float | None = None, at: datetime | None = None) -> None:
        """Serve ``feature`` frozen at ``value`` (its default when None), logged at ``at`` (now when None; a live
        replay passes its simulated time, so that the log reads on the same calendar as the freeze's expiry)."""

    @abstractmethod
    def unfreeze(self, feature: str, reason: str, at: datetime | None = None) -> None:
        """Serve ``feature`` live again (nothing when it was not frozen), logged at ``at`` (now when None)."""

    @abstractmethod
    def freeze_log(self) -> list[FreezeEvent]: ...

    @abstractmethod
    def close(self) -> None: ...

    def get_online_features(self, entity_rows: Iterable[Mapping[str, Any]]) -> FeatureBatch:
        return get_online_features(self, entity_rows)


def check_views_fit(fs: FeatureSet) -> None:
    """A store keeps at most MAX_FIELDS values per key: say which view is too wide before anything is written."""
    wide = [f"{v} ({len(f)})" for v, f in fs.view_fields.items() if len(f) > MAX_FIELDS]
    if wide:
        raise FeatureSpecError(f"online store: at most {MAX_FIELDS} fields per view; too wide: {', '.join(wide)}")


def _source_key(key: Key) -> pl.Expr:
    if key.kind == "utc_hour":
        return pl.col(key.column).dt.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    return pl.col(key.column).cast(pl.String)


def build_views(
    fs: FeatureSet, sources: Mapping[str, pl.DataFrame], history: pl.DataFrame, *, as_of: date
) -> dict[str, pl.DataFrame]:
    """The tables of a snapshot, each as a ``key`` column plus the view's fields (``fs.view_fields``), computed with
    the same declarations as the offline path."""
    check_views_fit(fs)
    day = fs.entity.date
    hist = entity_frame(fs, history)
    views: dict[str, pl.DataFrame] = {}
    for h in fs.histories:
        totals = (
            daily_totals(fs, hist, h)
            .filter(pl.col(day) < as_of)  # the day each value became known
            .group_by(list(h.keys))
            .agg(pl.col("n").sum().alias("n_cum"), pl.col("total").sum().alias("sum_cum"))
        )
        views[h.feature] = totals.select(
            pl.concat_str([pl.col(k).cast(pl.String) for k in h.keys], separator="|").alias("key"),
            pl.col("n_cum").cast(pl.Float64),
            pl.col("sum_cum").cast(pl.Float64),
        )
    for v in fs.lookups:
        table = v.table(sources[v.source])
        views[v.name] = table.select(
            pl.concat_str([_source_key(k) for k in v.keys], separator="|").alias("key"),
            *[pl.col(f).cast(pl.Float64) for f in v.fields],
        )
    return views


_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _as_date(v: Any) -> date:
    if isinstance(v, datetime):
        return v.date()
    if isinstance(v, date):
        return v
    return date.fromisoformat(str(v))


@lru_cache(maxsize=4096)
def _hour_key(v: Any) -> str:
    """A ``utc_hour`` key's text: the UTC hour, as build_views writes it."""
    dt = v if isinstance(v, datetime) else datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    if dt.tzinfo is not None and dt.utcoffset():
        dt = dt.astimezone(UTC)
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:00:00+00:00"


def _keys(columns: Mapping[str, Sequence[Any]], keys: tuple[Key, ...]) -> list[str]:
    """Each row's store key for a view: its key columns' text (a ``utc_hour`` key as its UTC hour), joined by ``|``.
    One list comprehension per key column: this runs for every request."""
    parts = [
        [_hour_key(v) for v in columns[k.column]] if k.kind == "utc_hour" else [str(v) for v in columns[k.column]]
        for k in keys
    ]
    return parts[0] if len(parts) == 1 else ["|".join(p) for p in zip(*parts, strict=True)]


def get_online_features(store: OnlineStore, entity_rows: Iterable[Mapping[str, Any]]) -> FeatureBatch:
    """Feature vectors for entity rows (each with the feature set's ``entity.request_columns``). Each result has
    every feature, ``degraded`` (frozen features served with their freeze value) and ``missing`` (features with no
    value in the store, served as null)."""
    fs = store.features
    rows = list(entity_rows)
    if rows:
        absent = [c for c in fs.entity.request_columns if c not in rows[0]]
        if absent:
            raise ValueError(f"entity rows need {', '.join(fs.entity.request_columns)}; missing {', '.join(absent)}")
    return get_online_columns(store, {c: [r[c] for r in rows] for c in fs.entity.request_columns}, len(rows))


def get_online_columns(store: OnlineStore, columns: Mapping[str, Sequence[Any]], n: int) -> FeatureBatch:
    """``get_online_features`` for entities given as columns: ``columns[c][i]`` is entity i's request column c
    (every one of ``entity.request_columns``, ``n`` values each) — what a batch's columnar contract check yields,
    without a dict per entity."""
    fs = store.features
    n_features = len(fs.names)
    if n == 0:
        return FeatureBatch(fs, np.empty((n_features, 0)), np.empty((n_features, 0), dtype=bool), ())
    absent = [c for c in fs.entity.request_columns if c not in columns]
    if absent:
        raise ValueError(f"entity rows need {', '.join(fs.entity.request_columns)}; missing {', '.join(absent)}")
    keys = {view: _keys(columns, view_keys) for view, view_keys in fs.view_keys.items()}
    found = store.lookup_many(keys)
    arrays: dict[str, np.ndarray] = {}

    def col(name: str) -> np.ndarray:
        if name not in arrays:
            if name == fs.entity.date:  # days since 1970-01-01: numpy converts date objects one by one, slowly
                days = np.array([_as_date(v).toordinal() for v in columns[name]], dtype=np.int64)
                arrays[name] = (days - _EPOCH_ORDINAL).astype("datetime64[D]")
            else:
                arrays[name] = np.array(columns[name], dtype=np.float64)
        return arrays[name]

    values: dict[str, np.ndarray] = {}
    for r in fs.request:
        values |= r.compute(col, NumpyOps)
    for v in fs.lookups:
        fields = fs.view_fields[v.name]
        hits = _hits(found[v.name], keys[v.name], len(fields))
        looked_up = {name: hits[:, i] for i, name in enumerate(fields)}
        if v.compute is None:
            values |= looked_up
        else:
            values |= v.compute(lambda name, lu=looked_up: lu[name] if name in lu else col(name), NumpyOps)
    for h in fs.histories:
        hits = _hits(found[h.feature], keys[h.feature], 2)
        values[h.feature] = h.smoothed(hits[:, 1], hits[:, 0], NumpyOps)  # view fields: (n_cum, sum_cum)
    frozen = store.frozen()
    features = [values[name] for name in fs.names]
    if any(np.ndim(c) == 0 for c in features):  # a constant feature: one value for every row
        features = [c if np.ndim(c) else np.full(n, c, dtype=np.float64) for c in features]
    matrix = np.vstack(features)  # features × rows
    for name, value in frozen.items():
        if name in fs.by_name:
            matrix[fs.names.index(name)] = value  # served with its freeze value
    return FeatureBatch(fs, matrix, np.isnan(matrix), tuple(f for f in frozen if f in fs.by_name))


def _hits(found: Mapping[str, tuple], keys: list[str], width: int) -> np.ndarray:
    """[len(keys), width] float64: each key's looked-up values (a store keeps ``width`` or more per key), NaN where
    the key was not found or a value is null."""
    got = list(map(found.get, keys))
    if None not in got:  # every key found (the common case): one conversion
        return np.array(got, dtype=np.float64)[:, :width]
    out = np.full((len(keys), width), np.nan)
    index = [i for i, v in enumerate(got) if v is not None]
    if index:
        out[index] = np.array([got[i][:width] for i in index], dtype=np.float64)
    return out


class FeatureBatch(Sequence):
    """The answer of ``get_online_features``: columnar (what a model consumes), and a sequence of per-row dicts
    (built on first access) for everything else.

    ``matrix`` is features × rows (float64, NaN where a value is missing), in the feature set's order.
    """

    def __init__(self, fs: FeatureSet, matrix: np.ndarray, nulls: np.ndarray, degraded: tuple[str, ...]):
        self.features = fs
        self.names = fs.names
        self.matrix = matrix
        self.nulls = nulls
        self.degraded = degraded
        self._rows: list[dict[str, Any]] | None = None

    def column(self, name: str) -> np.ndarray:
        return self.matrix[self.names.index(name)]

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
        """One dict per row: every feature (None where missing), ``missing`` and ``degraded``."""
        if self._rows is not None:
            return self._rows
        names = self.names
        ints = {f.name for f in self.features.features if f.dtype == "int"}
        columns = []
        for i, name in enumerate(names):
            row_nulls = self.nulls[i]
            arr = np.where(row_nulls, 0.0, self.matrix[i]).astype(np.int64) if name in ints else self.matrix[i]
            as_list = arr.tolist()
            if row_nulls.any():
                as_list = [None if m else x for x, m in zip(as_list, row_nulls.tolist(), strict=True)]
            columns.append(as_list)
        has_null = self.nulls.any(axis=0).tolist()
        out = []
        for j, row_values in enumerate(zip(*columns, strict=True)):
            row = dict(zip(names, row_values, strict=True))
            row["missing"] = [names[i] for i in np.flatnonzero(self.nulls[:, j])] if has_null[j] else []
            row["degraded"] = list(self.degraded)
            out.append(row)
        self._rows = out
        return out
