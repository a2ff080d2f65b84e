"""Changes planted in what lands: a data drill, named as such — fault injection for the loop, not a correction.

A live replay's landing zone (keel/data/landing.py) delivers a use case's raw tables day by day. A **plant** changes
what lands from a known day on, so that what the loop must do is known in advance: a shifted label rate (a share of
the flights landing late), a feature whose meaning changes (a city's index doubled). It is declared in
``$KEEL_HOME/landing/plants.json``, a list of objects::

    [{"usecase": "flights", "table": "flights", "from_day": "2013-04-01", "column": "arr_delay", "value": "60",
      "share": 0.2, "seed": 46, "why": "known outcome: April's flights a fifth later"}]

From ``from_day`` (to ``until_day``, when given), ``share`` of each day's rows of ``table`` land with ``column`` set to
``value`` (text, as every raw column is) — where the column has a value: a missing one stays missing (a cancelled
flight keeps no arrival delay). The rows are chosen by their ``_source_row`` and ``seed`` with a fixed
arithmetic hash — the same rows on every run and every machine. Rows are changed, never added or dropped: every raw
row still lands exactly once. A plant that names an unknown use case's table or column, or a share outside 0–1, is an
error naming the file, the entry and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import date
from pathlib import Path

import polars as pl

from keel.errors import KeelError

PLANTS_FILE = "plants.json"  # in the landing zone's root ($KEEL_HOME/landing)
_BUCKETS = 10_000  # a share is resolved to 1/10,000 of the rows
_MULTIPLIER, _MODULUS = 2_654_435_761, 2**32  # Knuth's multiplicative hash of the row number


class PlantError(KeelError):
    """A plants file that cannot be applied: not JSON, a missing or unknown field, a table or column that is not there."""


@dataclass(frozen=True)
class Plant:
    usecase: str
    table: str
    from_day: date
    column: str
    value: str
    share: float
    seed: int = 0
    until_day: date | None = None
    why: str = ""

    def applies(self, usecase: str, table: str, day: date) -> bool:
        return (self.usecase, self.table) == (usecase, table) and self.from_day <= day <= (self.until_day or day)

    def chosen(self) -> pl.Expr:
        """The rows this plant changes: a fixed hash of ``_source_row`` and ``seed`` below the share."""
        row = pl.col("_source_row").cast(pl.UInt64)
        hashed = ((row + self.seed) * _MULTIPLIER) % _MODULUS
        return (hashed % _BUCKETS) < round(self.share * _BUCKETS)

    def apply(self, rows: pl.DataFrame) -> pl.DataFrame:
        if self.column not in rows.columns:
            raise PlantError(f"plant on {self.usecase}.{self.table}: no column {self.column!r} in the landed rows "
                             f"(columns: {', '.join(c for c in rows.columns if not c.startswith('_'))})")  # fmt: skip
        # a value is replaced, a missing one stays missing: a cancelled flight has no arrival delay to change (giving
        # it one would break the very contracts that guard the data, not plant a change in the world)
        present = pl.col(self.column).is_not_null() & (pl.col(self.column) != "")
        changed = (
            pl.when(self.chosen() & present).then(pl.lit(self.value, dtype=pl.String)).otherwise(pl.col(self.column))
        )
        return rows.with_columns(changed.alias(self.column))


def read_plants(root: Path) -> tuple[Plant, ...]:
    """The plants of the landing zone at ``root`` (none when it has no plants file)."""
    path = Path(root) / PLANTS_FILE
    if not path.exists():
        return ()
    try:
        entries = json.loads(path.read_text())
    except ValueError as exc:
        raise PlantError(f"{path}: not JSON: {exc}") from None
    if not isinstance(entries, list):
        raise PlantError(f"{path}: a list of plants, got {type(entries).__name__}")
    return tuple(_plant(path, i, entry) for i, entry in enumerate(entries))


def _plant(path: Path, i: int, entry: object) -> Plant:
    where = f"{path} entry {i}"
    if not isinstance(entry, dict):
        raise PlantError(f"{where}: an object, got {type(entry).__name__}")
    known = {f.name for f in fields(Plant)}
    unknown = sorted(set(entry) - known)
    missing = sorted({"usecase", "table", "from_day", "column", "value", "share"} - set(entry))
    if unknown or missing:
        raise PlantError(f"{where}: " + "; ".join(
            ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
            + ([f"missing {', '.join(missing)}"] if missing else [])))  # fmt: skip
    for name in ("usecase", "table", "column", "why"):
        if name in entry and not isinstance(entry[name], str):
            raise PlantError(f"{where} field {name}: text, got {entry[name]!r}")
    try:
        days = {k: date.fromisoformat(entry[k]) for k in ("from_day", "until_day") if entry.get(k) is not None}
    except (TypeError, ValueError) as exc:
        raise PlantError(f"{where}: from_day/until_day are YYYY-MM-DD: {exc}") from None
    share = entry["share"]
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise PlantError(f"{where} field share: a number from 0 to 1, got {share!r}")
    if not isinstance(entry["value"], str):
        raise PlantError(f"{where} field value: text (raw columns are text), got {entry['value']!r}")
    if days.get("until_day") and days["until_day"] < days["from_day"]:
        raise PlantError(f"{where}: until_day {days['until_day']} is before from_day {days['from_day']}")
    seed = entry.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PlantError(f"{where} field seed: a non-negative integer, got {seed!r}")
    return Plant(**{**entry, **days, "share": float(share)})


def check_plants(plants: tuple[Plant, ...], usecase: str, tables: tuple[str, ...], root: Path) -> None:
    """Each plant of ``usecase`` names one of its landed ``tables``."""
    for plant in plants:
        if plant.usecase == usecase and plant.table not in tables:
            raise PlantError(f"{Path(root) / PLANTS_FILE}: {usecase} lands {', '.join(tables)}, not {plant.table!r}")
