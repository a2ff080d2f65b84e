"""The key a caller scores a row by, and the columns held to the time (issue 61 item 12).

A row is keyed by what a caller has: its ``--entity`` columns and its time; with no entity, by its time alone when
the time names one row (its repeats are exact duplicates, which the contract quarantines); only a table with several
rows an instant and no entity falls back to the row's number in the file (``row_ref``), which no caller really has.
A column that is a part of the time on every row (an hour column beside a timestamp) is held to it — in the source
contract and in the request contract — so a request cannot ask about hour 100, or 5 at 14:00.
"""

from __future__ import annotations

import polars as pl

from keel.new.choices import Rule
from keel.new.profile import ColumnProfile, TableProfile


def row_key(
    profile: TableProfile, frame: pl.DataFrame, time: ColumnProfile, label: ColumnProfile, entity: tuple[str, ...]
) -> tuple[bool, dict[str, str], list[Rule]]:
    """(keyed by the time alone, column → the part of the time it is, the rules that hold those columns to it)."""
    instants = frame[time.ident].drop_nulls()
    time_key = not entity and instants.len() - instants.n_unique() <= profile.duplicate_rows
    parts = derived_parts(frame, time, [c for c in profile.columns if c.ident != label.ident])
    rules = [
        Rule(
            f"{col}_is_the_{part}",
            {"type": "timestamp_parts", "column": time.ident, "parts": {part: col}},
            f"{col} is the {part} of {time.ident} on every row of the table: a row or request whose {col} disagrees "
            f"with its {time.ident} is an entry error",
        )
        for col, part in parts.items()
    ]
    return time_key, parts, rules


def derived_parts(frame: pl.DataFrame, time: ColumnProfile, columns: list[ColumnProfile]) -> dict[str, str]:
    """column → the part of ``time`` (hour, month, day) it equals on every row where it has a value."""
    out = {}
    parts = (("hour", lambda t: t.dt.hour()),) if time.kind == "datetime" else ()
    parts += (("month", lambda t: t.dt.month()), ("day", lambda t: t.dt.day()))
    for c in columns:
        if c.kind != "int" or c.ident == time.ident or c.distinct < 2:
            continue
        for part, of in parts:
            both = frame.select(pl.col(c.ident), of(pl.col(time.ident)).alias("_p")).drop_nulls()
            if both.height and bool((both[c.ident] == both["_p"]).all()):
                out[c.ident] = part
                break
    return out
