"""Features in Flink SQL from the same definitions the offline and online paths use.

``keel.features.definitions`` writes each feature once against a few primitives (month, weekday, year, casts,
fill-null) with a polars and a numpy implementation; ``SqlOps`` is a third, producing Flink SQL expressions. The
request features (calendar, hour, distance) are computed from the flight row alone, so the streaming job computes
them with those very definitions. Weather, plane and history features need a lookup or state across events
(a temporal join with the weather stream, a plane table, per-group running counts): not expressed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from keel.features.definitions import request_features


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
    """The primitives of keel.features.definitions on Flink SQL expressions."""

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


SCHED_DATE = Sql(
    "TO_DATE(CONCAT(CAST(`year` AS STRING), '-', LPAD(CAST(`month` AS STRING), 2, '0'), '-', "
    "LPAD(CAST(`day` AS STRING), 2, '0')))"
)


def request_feature_sql() -> dict[str, str]:
    """feature name → Flink SQL over the typed flight columns (the contract's year, month, day, hour, distance)."""

    def col(name: str) -> Sql:
        return SCHED_DATE if name == "sched_date" else Sql(f"`{name}`")

    return {name: expr.text for name, expr in request_features(col, SqlOps).items()}
