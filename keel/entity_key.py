"""The entity key: how an answer the gateway gave meets the outcome that arrives later.

A use case declares it on its entity (``Entity.key``): some columns of the request (after its contract) and of the
entity's source rows, and a timestamp column, joined as ``value-value-…-YYYY-MM-DDTHH:MM:SSZ`` (the timestamp in
UTC, last), e.g. ``UA-1545-EWR-2013-01-01T10:00:00Z`` for a flight. The gateway writes it into each exposure record
of a one-entity request (``entity_key``); the canary and guardrail sensors, experiment analysis and the lake join
it to the realized label of the same row. This module is its only spelling: the record form (``of``), the frame
form (``expr``) and the parts read back (``month``, ``hour``, ``part``).

The parts are read from the ends, not by splitting the whole key: the timestamp has dashes of its own. A key column's
values must not contain the separator (the request contract's patterns hold that).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
STAMP_LENGTH = len("2013-01-01T10:00:00Z")


@dataclass(frozen=True)
class EntityKey:
    columns: tuple[str, ...]
    time: str
    separator: str = "-"

    def of(self, record: Mapping[str, Any]) -> str:
        """The key of one record (its time a datetime, or ISO text as requests carry it)."""
        t = record[self.time]
        stamp = t.strftime(STAMP_FORMAT) if hasattr(t, "strftime") else str(t)
        return self.separator.join([*(str(record.get(c)) for c in self.columns), stamp])

    def expr(self, stamp_format: str = STAMP_FORMAT) -> pl.Expr:
        """The key as a polars expression over a frame with the key columns and a datetime time column.
        ``stamp_format`` coarsens the stamp for keys that only need the hour (the experiment simulator's units)."""
        return pl.concat_str(
            [*(pl.col(c).cast(pl.String) for c in self.columns), pl.col(self.time).dt.strftime(stamp_format)],
            separator=self.separator,
        )

    @staticmethod
    def month(key: pl.Expr) -> pl.Expr:
        """YYYY-MM of the key's time: which month's partition holds the outcome."""
        return key.str.slice(-STAMP_LENGTH, 7)

    @staticmethod
    def hour(key: pl.Expr) -> pl.Expr:
        """The key's hour (UTC) as an integer."""
        return key.str.slice(-9, 2).cast(pl.Int32, strict=False)  # …THH:MM:SSZ

    def part(self, key: pl.Expr, column: str) -> pl.Expr:
        """The value of key column ``column`` (text)."""
        return key.str.split(self.separator).list.get(self.columns.index(column), null_on_oob=True)
