"""Features in Flink SQL from the same definitions the offline and online paths use.

A use case's feature functions (keel/features/spec.py) are written once against a few primitives (month, weekday,
year, casts, fill-null) with a polars and a numpy implementation; ``SqlOps`` is a third, producing Flink SQL
expressions. Request features are computed from the request row alone, so the streaming job computes them with
those very functions. Lookups and histories need a join or state across events (a temporal join with another
stream, a table, per-group running counts): not expressed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from keel.features.spec import FeatureSet


@dataclass(frozen=True)
class Sql:
    """An SQL expression that definitions can combine with Python operators."""

    text: str
    boolean: bool = False

    def __ge__(self, other):
        return Sql(f"({self.text} >= {_sql(other)})", boolean=True)

    def __gt__(self, other):
        return Sql(f"({self.text} > {_sql(other)})", boolean=True)

    def __le__(self, other):
        return Sql(f"({self.text} <= {_sql(other)})", boolean=True)

    def __lt__(self, other):
        return Sql(f"({self.text} < {_sql(other)})", boolean=True)

    def __sub__(self, other):
        return Sql(f"({self.text} - {_sql(other)})")

    def __add__(self, other):
        return Sql(f"({self.text} + {_sql(other)})")

    def __mul__(self, other):
        return Sql(f"({self.text} * {_sql(other)})")

    def __truediv__(self, other):
        return Sql(f"(CAST({self.text} AS DOUBLE) / {_sql(other)})")


def _sql(x) -> str:
    return x.text if isinstance(x, Sql) else repr(x)


class SqlOps:
    """The feature primitives (keel.features.spec.PolarsOps) on Flink SQL expressions."""

    @staticmethod
    def month(d: Sql) -> Sql:
        return Sql(f"EXTRACT(MONTH FROM {d.text})")

    @staticmethod
    def weekday(d: Sql) -> Sql:
        return Sql(f"(MOD(DAYOFWEEK({d.text}) + 5, 7) + 1)")  # DAYOFWEEK: 1 = Sunday; ISO: 1 = Monday … 7 = Sunday

    @staticmethod
    def year(d: Sql) -> Sql:
        return Sql(f"CAST(EXTRACT(YEAR FROM {d.text}) AS DOUBLE)")

    @staticmethod
    def as_int(x: Sql) -> Sql:
        return Sql(f"CASE WHEN {x.text} THEN 1 ELSE 0 END" if x.boolean else f"CAST({x.text} AS INT)")

    @staticmethod
    def as_float(x: Sql) -> Sql:
        return Sql(f"CAST({x.text} AS DOUBLE)")

    @staticmethod
    def fill0(x: Sql) -> Sql:
        return Sql(f"COALESCE({x.text}, 0)")


def date_sql(fs: FeatureSet) -> Sql:
    """The entity's date in Flink SQL: its column, or built from its (year, month, day) parts."""
    e = fs.entity
    if e.date_parts is None:
        return Sql(f"`{e.date}`")
    y, m, d = e.date_parts
    return Sql(
        f"TO_DATE(CONCAT(CAST(`{y}` AS STRING), '-', LPAD(CAST(`{m}` AS STRING), 2, '0'), '-', "
        f"LPAD(CAST(`{d}` AS STRING), 2, '0')))"
    )


def request_feature_sql(fs: FeatureSet) -> dict[str, str]:
    """feature name → Flink SQL over the typed columns of the entity's contract, for every request feature."""
    date = date_sql(fs)

    def col(name: str) -> Sql:
        return date if name == fs.entity.date else Sql(f"`{name}`")

    return {name: expr.text for r in fs.request for name, expr in r.compute(col, SqlOps).items()}
