"""A use case's features, declared: what keel computes offline (the training table) and online (the gateway's lookups).

A ``FeatureSet`` is made of declarations that the platform computes, each producing some of its ``features``:

- ``Entity``: the rows being scored (a flight, a booking): the id column of the feature table, the date a row is
  scored *as of*, the columns a request carries and those the table keeps;
- ``RequestFeatures``: computed from the request row alone — a function written once against ``col`` (a column
  by name) and ``ops`` (a handful of primitives: month, weekday, year, casts, fill-null), evaluated with polars
  offline (``PolarsOps``), numpy online (``NumpyOps``) and as Flink SQL on the stream (keel.streaming.features_sql);
- ``Lookup``: values from another table keyed by request columns (an exact key such as a tail number, or a
  point-in-time key such as the scheduled UTC hour of an hourly observation); its ``fields`` are polars expressions
  over the source table; its features are the fields themselves or a function of them like a request feature's;
- ``History``: a smoothed mean of a value over rows of *earlier days only*, per group of key columns (a late share,
  an average price): ``(sum + prior × weight) / (n + weight)``;
- ``Label``: the training target, a polars expression over the entity's source rows, and the task it makes
  (keel/features/label.py, with its domain).

Column lineage is derived from the declarations (``column_sources``): expressions name their input columns, and
the functions are run once on ``LineageOps``, which records which columns each feature reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
import polars as pl

from keel.entity_key import EntityKey
from keel.errors import FeatureSpecError
from keel.features.label import Label, LabelDomain, Task  # noqa: F401 - declared with the others, imported from here
from keel.features.ops import DateTrace, LineageOps, NumpyOps, PolarsOps, Trace

FeatureFn = Callable[[Callable[[str], Any], Any], dict[str, Any]]
DTYPES: dict[str, type[pl.DataType]] = {"int": pl.Int32, "float": pl.Float64}
IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Feature:
    """One model input: its type (``int`` or ``float``), the range health checks and the gateway hold values to, and
    the reference default (what a frozen or missing feature is served as)."""

    name: str
    dtype: Literal["int", "float"]
    lo: float
    hi: float
    default: float
    description: str

    def __post_init__(self) -> None:
        if not IDENTIFIER.fullmatch(self.name):
            raise FeatureSpecError(
                f"feature {self.name!r}: a name is letters, digits and _ (lower case, starting with a letter)"
            )
        if self.dtype not in DTYPES:
            raise FeatureSpecError(f"feature {self.name}: dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not self.lo <= self.default <= self.hi:
            raise FeatureSpecError(f"feature {self.name}: default {self.default} is outside [{self.lo}, {self.hi}]")

    @property
    def polars_type(self) -> type[pl.DataType]:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class Entity:
    """The rows a model scores.

    ``source``: the dataset the rows come from (for lineage; the use case's validated table). ``date``: the column a
    row is scored as of — a date column of the source, or built from ``date_parts`` (year, month, day integer
    columns) when given. ``id_parts``: the columns whose values, joined with ``-``, are the row's id (unique per the
    source's contract). ``request_columns``: what a caller sends for a row (the date column included); ``carried``:
    the entity columns the feature table keeps beside the features. ``key``: the entity key an exposure record
    carries so that the realized label finds it (keel/entity_key.py).
    """

    name: str
    source: str
    id_column: str
    id_parts: tuple[str, ...]
    date: str
    request_columns: tuple[str, ...]
    carried: tuple[str, ...]
    date_parts: tuple[str, str, str] | None = None
    key: EntityKey | None = None  # how exposures meet outcomes (keel/entity_key.py); None: not joined
    # The carried column whose month is the row's partition (a booking's arrival, though it is scored as of the day
    # it was made): training, early-stopping and gate rows are chosen by its months and days. None: the entity date.
    partition_date: str | None = None

    @property
    def partition_day(self) -> pl.Expr:
        """The row's partition date as a polars Date expression (text ``YYYY-MM-DD…`` is parsed)."""
        if self.partition_date is None:
            return pl.col(self.date)
        return pl.col(self.partition_date).cast(pl.String).str.slice(0, 10).str.to_date("%Y-%m-%d")

    def __post_init__(self) -> None:
        if self.partition_date is not None and self.partition_date not in (self.date, *self.carried):
            raise FeatureSpecError(
                f"entity {self.name}: partition_date {self.partition_date} must be a carried column (the feature "
                "table keeps it)"
            )
        if self.date not in self.request_columns:
            raise FeatureSpecError(f"entity {self.name}: request_columns must include the date column {self.date}")
        if not self.id_parts:
            raise FeatureSpecError(f"entity {self.name}: id_parts is empty")

    def with_date(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Source rows → entity rows: the date column (built from its parts when declared) and the id."""
        if self.date_parts is not None:
            y, m, d = self.date_parts
            rows = rows.with_columns(pl.date(pl.col(y), pl.col(m), pl.col(d)).alias(self.date))
        return rows.with_columns(
            pl.concat_str([pl.col(c).cast(pl.String) for c in self.id_parts], separator="-").alias(self.id_column)
        )

    def date_of(self, record: Mapping[str, Any]) -> Any:
        """The date of one request record (its parts must already be valid integers: the contract checked them)."""
        from datetime import date

        if self.date_parts is None:
            return record[self.date]
        y, m, d = self.date_parts
        return date(record[y], record[m], record[d])


@dataclass(frozen=True)
class RequestFeatures:
    """Features computed from the request row alone: ``compute(col, ops)`` returns {feature: value}."""

    name: str
    compute: FeatureFn


@dataclass(frozen=True)
class Key:
    """One key column of a lookup: ``column`` of the request row matched to ``source_column`` of the looked-up
    table. ``kind``: ``value`` (matched as text) or ``utc_hour`` (a timestamp matched on its UTC hour — a
    point-in-time join with an hourly observation)."""

    column: str
    source_column: str | None = None
    kind: Literal["value", "utc_hour"] = "value"

    @property
    def source(self) -> str:
        return self.source_column or self.column


@dataclass(frozen=True, eq=False)
class Lookup:
    """Values of another table keyed by request columns. ``fields``: {stored name: polars expression over the
    source}; ``compute``: features from the fields (and request columns) as ``compute(col, ops)``, or None when the
    fields are the features. The first row per key wins."""

    name: str
    source: str
    keys: tuple[Key, ...]
    fields: Mapping[str, pl.Expr]
    compute: FeatureFn | None = None

    def table(self, source: pl.DataFrame) -> pl.DataFrame:
        """The source reduced to key columns (named as the request's) and fields."""
        return source.select(
            *[pl.col(k.source).alias(k.column) for k in self.keys],
            *[expr.alias(name) for name, expr in self.fields.items()],
        ).unique([k.column for k in self.keys], keep="first", maintain_order=True)


@dataclass(frozen=True, eq=False)
class History:
    """A smoothed mean of ``value`` (a polars expression over earlier rows of the entity's source; rows where it is
    null are not counted) per group of ``keys``, from days strictly before the row's date. ``known_on``: when a row's
    value becomes known, as a date expression over its columns (a hotel stay's price once the stay is over:
    ``pl.col("arrival_date") + pl.duration(days=15)``); a row counts from the day after — offline as online, where it
    has landed by then. None: at the end of the row's own day (the entity date)."""

    feature: str
    keys: tuple[str, ...]
    value: pl.Expr
    prior: float
    weight: float
    known_on: pl.Expr | None = None

    def __post_init__(self) -> None:
        if self.known_on is not None and not isinstance(self.known_on, pl.Expr):
            raise FeatureSpecError(
                f"history {self.feature}: known_on must be a polars expression, got {type(self.known_on).__name__}"
            )

    def smoothed(self, total: Any, n: Any, ops: Any) -> Any:
        return (ops.fill0(total) + self.prior * self.weight) / (ops.fill0(n) + self.weight)


@dataclass(frozen=True, eq=False)
class FeatureSet:
    """Everything the feature table and the online store are computed from. ``features`` is the model's input order."""

    entity: Entity
    features: tuple[Feature, ...]
    label: Label
    request: tuple[RequestFeatures, ...] = ()
    lookups: tuple[Lookup, ...] = ()
    histories: tuple[History, ...] = ()

    def __post_init__(self) -> None:
        self._check_request_features()
        names = [f.name for f in self.features]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FeatureSpecError(f"feature set of {self.entity.name}: features declared twice: {', '.join(dup)}")
        produced = self.producers
        unproduced = [n for n in names if n not in produced]
        extra = sorted(set(produced) - set(names))
        if unproduced or extra:
            raise FeatureSpecError(
                f"feature set of {self.entity.name}: "
                + "; ".join(
                    s
                    for s in (
                        unproduced and f"declared but computed by nothing: {', '.join(unproduced)}",
                        extra and f"computed but not declared: {', '.join(extra)}",
                    )
                    if s
                )
            )
        views = [v.name for v in self.lookups] + [h.feature for h in self.histories]
        if len(set(views)) != len(views):
            raise FeatureSpecError(f"feature set of {self.entity.name}: two lookups or histories share a name")
        for key in {k.column for v in self.lookups for k in v.keys} | {k for h in self.histories for k in h.keys}:
            if key not in self.entity.request_columns:
                raise FeatureSpecError(f"feature set of {self.entity.name}: key {key} is not a request column")

    def _check_request_features(self) -> None:
        """Each request feature traced once at load, so a mistake is named here rather than deep in lineage or on the
        first request: a column that is not a request column, a comparison with text, a value not computed with the
        ops (a Python bool, a constant)."""
        where = f"feature set of {self.entity.name}"
        for r in self.request:
            try:
                traced = _run(r.compute, LineageOps.col_tracer(self._date_trace()), LineageOps)
            except TypeError as exc:
                raise FeatureSpecError(f"{where}: request features {r.name}: {exc}") from None
            for name, value in traced.items():
                if not isinstance(value, Trace):
                    raise FeatureSpecError(
                        f"{where}: request feature {name} ({r.name}) is a {type(value).__name__}, not a value "
                        "computed from request columns with col() and ops"
                    )
                unknown = sorted(value.columns - set(self.entity.request_columns) - set(self.entity.date_parts or ()))
                if unknown:
                    raise FeatureSpecError(
                        f"{where}: request feature {name} ({r.name}) reads {', '.join(unknown)}, not a request "
                        f"column (request columns: {', '.join(self.entity.request_columns)})"
                    )

    @cached_property
    def producers(self) -> dict[str, str]:
        """feature → the declaration that computes it."""
        out: dict[str, str] = {}
        for r in self.request:
            out |= {name: r.name for name in _run(r.compute, LineageOps.col_tracer({}), LineageOps)}
        for v in self.lookups:
            names = v.fields if v.compute is None else _run(v.compute, LineageOps.col_tracer({}), LineageOps)
            out |= {name: v.name for name in names}
        out |= {h.feature: h.feature for h in self.histories}
        return out

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    @cached_property
    def by_name(self) -> dict[str, Feature]:
        return {f.name: f for f in self.features}

    @cached_property
    def view_fields(self) -> dict[str, tuple[str, ...]]:
        """What the online store keeps per key of each view (lookups: their fields; histories: n and sum)."""
        return {
            **{v.name: tuple(v.fields) for v in self.lookups},
            **{h.feature: ("n_cum", "sum_cum") for h in self.histories},
        }

    @cached_property
    def view_keys(self) -> dict[str, tuple[Key, ...]]:
        """The key columns of each view of the online store (a history's group columns as plain value keys)."""
        return {
            **{v.name: v.keys for v in self.lookups},
            **{h.feature: tuple(Key(k) for k in h.keys) for h in self.histories},
        }

    @cached_property
    def table_columns(self) -> tuple[str, ...]:
        """The feature table's columns, in order: id, carried entity columns, features, label."""
        return (self.entity.id_column, *self.entity.carried, *self.names, self.label.column)

    @cached_property
    def defaults(self) -> np.ndarray:
        return np.array([f.default for f in self.features], dtype=np.float64)

    def column_sources(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """Where each column of the feature table comes from: (input dataset, column), join keys included (a wrong
        key changes a looked-up value as surely as a wrong value)."""
        e = self.entity
        src = e.source

        def expand(columns) -> list[tuple[str, str]]:
            out: list[tuple[str, str]] = []
            for c in columns:
                parts = e.date_parts if (c == e.date and e.date_parts) else (c,)
                out += [(src, p) for p in parts]
            return out

        sources: dict[str, list[tuple[str, str]]] = {e.id_column: expand(e.id_parts)}
        sources |= {c: expand([c]) for c in e.carried}
        for r in self.request:
            for name, trace in _run(r.compute, LineageOps.col_tracer(self._date_trace()), LineageOps).items():
                sources[name] = expand(sorted(trace.columns, key=self._column_order))
        for v in self.lookups:
            keys = expand([k.column for k in v.keys]) + [(v.source, k.source) for k in v.keys]
            field_sources = {n: [(v.source, c) for c in expr.meta.root_names()] for n, expr in v.fields.items()}
            if v.compute is None:
                for name, fs in field_sources.items():
                    sources[name] = fs + keys
            else:
                tracer = LineageOps.col_tracer(self._date_trace(), fields=set(v.fields))
                for name, trace in _run(v.compute, tracer, LineageOps).items():
                    own = [s for f in v.fields if f in trace.columns for s in field_sources[f]]
                    other = expand(sorted((c for c in trace.columns if c not in v.fields), key=self._column_order))
                    sources[name] = own + keys + other
        for h in self.histories:
            outcome = [(src, c) for c in h.value.meta.root_names()]
            known = [(src, c) for c in h.known_on.meta.root_names()] if h.known_on is not None else []
            sources[h.feature] = outcome + expand([e.date]) + known + expand(h.keys)
        sources[self.label.column] = [(src, c) for c in self.label.expr.meta.root_names()]
        return {c: tuple(dict.fromkeys(sources[c])) for c in self.table_columns}

    def _date_trace(self) -> dict[str, Any]:
        e = self.entity
        return {e.date: DateTrace(*e.date_parts)} if e.date_parts else {}

    def _column_order(self, c: str) -> tuple[int, int]:
        e, cols = self.entity, self.entity.request_columns
        if e.date_parts and c in e.date_parts:
            return cols.index(e.date), e.date_parts.index(c)
        return (cols.index(c) if c in cols else len(cols)), 0


def _run(fn: FeatureFn, col: Callable[[str], Any], ops: Any) -> dict[str, Any]:
    return fn(col, ops)


__all__ = [
    "DateTrace",
    "Entity",
    "Feature",
    "FeatureSet",
    "FeatureSpecError",
    "History",
    "Key",
    "Label",
    "LineageOps",
    "Lookup",
    "NumpyOps",
    "PolarsOps",
    "RequestFeatures",
    "Trace",
]
