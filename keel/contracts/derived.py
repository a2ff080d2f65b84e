"""Columns a pipeline's reader adds and a file as delivered does not carry (``derived`` in a contract's schema): when
a file is validated without them (``keel contracts validate`` on the user's own CSV), they are derived here the way
the reader derives them — instead of every row failing the schema for a column the user was never meant to write
(issue 61 item 13: a table ``keel new`` made a package of was quarantined whole by its own contract).

- ``row_number``: the row's number in the file, from 0;
- ``timestamp_part``: the part of a timestamp a ``timestamp_parts`` rule names it for (``parts: {year: event_year}``),
  read in the rule's time zone from the timestamp column as the contract types it.

A column the file does carry is left as it is (and judged); only absent ones are derived. And a schema column the
file carries under the name it was written with (``Unit Price`` for ``unit_price``: ``keel new``'s identifiers,
keel/names.py ``column_identifier``) is read under the contract's name.
"""

from __future__ import annotations

import polars as pl

from keel.contracts.model import ContractSpec
from keel.contracts.values import cast_expr
from keel.errors import ContractError
from keel.names import column_identifier


def as_written(frame: pl.DataFrame, spec: ContractSpec) -> tuple[pl.DataFrame, dict[str, str]]:
    """``frame`` with each schema column it lacks but holds as written (one column whose identifier it is) renamed;
    the renames."""
    names = {c.name for c in spec.columns}
    by_ident: dict[str, list[str]] = {}
    for col in frame.columns:
        if col not in names:
            by_ident.setdefault(column_identifier(col), []).append(col)
    renames = {found[0]: ident for ident, found in by_ident.items() if ident in names and len(found) == 1}
    return frame.rename(renames), renames


def derive_missing(frame: pl.DataFrame, spec: ContractSpec) -> tuple[pl.DataFrame, list[str]]:
    """``frame`` with the contract's ``derived`` columns it lacks added (as text, as a file would hold them), and
    their names."""
    missing = [c for c in spec.columns if c.derived and c.name not in frame.columns]
    if not missing:
        return frame, []
    parts = {
        column: (rule.params["column"], rule.params["timezone"], part)
        for rule in spec.rules
        if rule.type == "timestamp_parts"
        for part, column in rule.params["parts"].items()
    }
    added = []
    for c in missing:
        if c.derived == "row_number":
            added.append(pl.int_range(pl.len(), dtype=pl.Int64).cast(pl.String).alias(c.name))
            continue
        if c.name not in parts:
            raise ContractError(
                f"contract {spec.name}: column {c.name} is derived as a timestamp_part, but no "
                "timestamp_parts rule names it in its parts"
            )
        source, tz, part = parts[c.name]
        if source not in frame.columns:
            continue  # the timestamp itself is missing: the schema says so
        stamp = spec.column(source)
        typed = cast_expr(pl.col(source), frame.schema[source], stamp.dtype, stamp.format)
        local = typed.dt.convert_time_zone(tz) if stamp.dtype == "datetime" else typed
        value = local.dt.strftime("%Y-%m-%d") if part == "date" else getattr(local.dt, part)().cast(pl.String)
        added.append(value.alias(c.name))
    return frame.with_columns(added), [c.name for c in missing]
