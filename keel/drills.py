"""What a use case's chaos drills break (keel/chaos.py runs them): declared on the use case (``UseCase.drills``),
so the platform's drills need no knowledge of its tables."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class UnitChange:
    """A day of ``table`` delivered with ``column`` in another unit: ``value × scale + offset`` (rounded to
    ``digits``), as an upstream that switched units sends it (the raw text columns). ``note`` says it in words."""

    table: str
    column: str
    scale: float
    offset: float
    note: str
    digits: int = 2

    def apply(self, frame: pl.DataFrame) -> pl.DataFrame:
        changed = (pl.col(self.column).cast(pl.Float64, strict=False) * self.scale + self.offset).round(self.digits)
        return frame.with_columns(changed.cast(pl.String).alias(self.column))


@dataclass(frozen=True)
class SchemaBreak:
    """A day of ``table`` delivered with column ``renamed[0]`` renamed ``renamed[1]`` and ``dropped`` missing."""

    table: str
    renamed: tuple[str, str]
    dropped: str

    def apply(self, frame: pl.DataFrame) -> pl.DataFrame:
        return frame.rename({self.renamed[0]: self.renamed[1]}).drop(self.dropped)

    @property
    def note(self) -> str:
        return f"{self.renamed[0]} renamed {self.renamed[1]} and {self.dropped} missing"


@dataclass(frozen=True)
class Drills:
    unit_change: UnitChange | None = None
    schema_break: SchemaBreak | None = None
