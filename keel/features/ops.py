"""The primitives feature functions are written against, in each form: polars expressions (offline), numpy arrays
(online), and ``Trace`` values (lineage: which columns a function reads). keel.streaming.features_sql adds Flink
SQL. A feature function uses only these and Python's operators, so every form computes the same feature."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl


class PolarsOps:
    """The primitives feature functions use, on polars expressions (the offline path)."""

    @staticmethod
    def month(d: pl.Expr) -> pl.Expr:
        return d.dt.month()

    @staticmethod
    def weekday(d: pl.Expr) -> pl.Expr:
        return d.dt.weekday()

    @staticmethod
    def year(d: pl.Expr) -> pl.Expr:
        return d.dt.year().cast(pl.Float64)

    @staticmethod
    def as_int(x: pl.Expr) -> pl.Expr:
        return x.cast(pl.Int32)

    @staticmethod
    def as_float(x: pl.Expr) -> pl.Expr:
        return x.cast(pl.Float64)

    @staticmethod
    def fill0(x: pl.Expr) -> pl.Expr:
        return x.fill_null(0)


class NumpyOps:
    """The same primitives on numpy arrays (the online path): dates are datetime64[D], numbers float64 with NaN for
    null. tests/features/test_parity.py holds the two to the same answers."""

    @staticmethod
    def month(d: np.ndarray) -> np.ndarray:
        return (d.astype("datetime64[M]").astype(np.int64) % 12 + 1).astype(np.float64)

    @staticmethod
    def weekday(d: np.ndarray) -> np.ndarray:
        return ((d.astype(np.int64) + 3) % 7 + 1).astype(np.float64)  # 1970-01-01 was a Thursday (ISO 4)

    @staticmethod
    def year(d: np.ndarray) -> np.ndarray:
        return (d.astype("datetime64[Y]").astype(np.int64) + 1970).astype(np.float64)

    @staticmethod
    def as_int(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)  # integer-valued; null stays NaN until the answer is built

    @staticmethod
    def as_float(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def fill0(x: np.ndarray) -> np.ndarray:
        return np.where(x == x, x, 0.0)  # NaN is the only value not equal to itself


@dataclass(frozen=True)
class Trace:
    """A value in a lineage run: the request or field columns it was computed from."""

    columns: frozenset[str]

    def _with(self, other: Any) -> Trace:
        return Trace(self.columns | (other.columns if isinstance(other, Trace) else frozenset()))

    def _compare(self, other: Any) -> Trace:
        if isinstance(other, str):  # online every request value is a number: text never equals anything
            raise TypeError(
                f"compares {', '.join(sorted(self.columns))} with the text {other!r}: request features compute on "
                "numbers (online each request value is a float); give the column a category code in the request "
                "contract and compare codes, or look the text up (a Lookup keyed by the column)"
            )
        return self._with(other)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _with
    __ge__ = __gt__ = __le__ = __lt__ = _with
    __eq__ = __ne__ = _compare  # (a comparison is a value of the feature, never Python's equality of two traces)
    __hash__ = object.__hash__


@dataclass(frozen=True)
class DateTrace(Trace):
    """The entity date built from parts: year() reads only the year, month() only the month."""

    year_part: str = ""
    month_part: str = ""
    day_part: str = ""

    def __init__(self, year: str, month: str, day: str):
        object.__setattr__(self, "columns", frozenset((year, month, day)))
        object.__setattr__(self, "year_part", year)
        object.__setattr__(self, "month_part", month)
        object.__setattr__(self, "day_part", day)


class LineageOps:
    """The primitives on ``Trace`` values: what a feature function reads, found by running it once."""

    @staticmethod
    def col_tracer(special: Mapping[str, Trace], fields: set[str] | None = None) -> Callable[[str], Trace]:
        return lambda name: special.get(name) or Trace(frozenset((name,)))

    @staticmethod
    def month(d: Trace) -> Trace:
        return Trace(frozenset((d.month_part,))) if isinstance(d, DateTrace) else d

    @staticmethod
    def year(d: Trace) -> Trace:
        return Trace(frozenset((d.year_part,))) if isinstance(d, DateTrace) else d

    @staticmethod
    def weekday(d: Trace) -> Trace:
        return Trace(d.columns)

    as_int = as_float = fill0 = staticmethod(lambda x: x)
