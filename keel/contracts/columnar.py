"""Many records' verdicts at once, columnar: the batch form of ``CompiledContract.validate_record``.

The gateway checks a request of up to 1,024 entities against the use case's request contract. Record by record that
is the rules evaluated in Python per row; here the records become one polars frame and the contract's own batch
expressions (``CompiledContract.plan``: typed columns, a mask per rule) decide every row in one pass — the pipeline's
path over a partition. The verdicts are the record path's (held equal on real requests and broken ones in
tests/contracts/test_columnar.py): the same sink, the same failed rules in the same order, and for a valid record
its typed values.

The record path stays the answer where a column cannot be formed or a record needs more than a mask: records with
different keys (a missing or an unexpected field: ``schema_columns``), values of mixed JSON types in one column
(``"1.5"`` or ``true`` beside numbers, a nested object), and a valid record an ``enrich`` rule fills in. Those records — or the
whole request, when its columns cannot be formed — go through ``validate_record``, one by one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from keel.contracts.engine import CompiledContract
from keel.contracts.results import RecordVerdict
from keel.contracts.sinks import MASK

_COLUMN_ERRORS = (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError)


def _frame(records: Sequence[Mapping[str, Any]]) -> pl.DataFrame | None:
    """The records as columns, or None when they cannot be: not all objects, different keys, or a column whose
    values polars will not take as one type without converting them."""
    if not records or not all(isinstance(r, Mapping) for r in records):
        return None
    keys = list(records[0])
    if any(len(r) != len(keys) or any(k not in r for k in keys) for r in records[1:]):
        return None
    columns = {k: [r[k] for r in records] for k in keys}
    for values in columns.values():
        kinds = {type(v) for v in values if v is not None}
        if not (kinds <= {int, float} or kinds in ({str}, {bool})):  # a bool among numbers would become 1
            return None
    try:
        return pl.DataFrame([pl.Series(k, v, strict=True) for k, v in columns.items()])
    except _COLUMN_ERRORS:
        return None


def validate_records(
    contract: CompiledContract,
    records: Sequence[Mapping[str, Any]],
    references: Mapping[str, pl.Series] | None = None,
) -> list[RecordVerdict]:
    """One verdict per record, as ``contract.validate_record`` gives it, decided over all of them at once."""
    frame = _frame(records)
    if frame is None:
        return [contract.validate_record(dict(r), references=references) for r in records]
    lf, stages = contract.plan(frame, None, references)
    rules = [r for r in contract.rules if r.id in stages.active]
    columns = list(contract.spec.column_names)
    checked = lf.select(columns + [MASK + r.id for r in rules]).collect().rows()  # one pass, one conversion
    width = len(columns)
    out = []
    for record, row in zip(records, checked, strict=True):
        values, failing = row[:width], row[width:]  # a null mask is a rule that did not fail (as in validate)
        failed = tuple(r.id for r, bad in zip(rules, failing, strict=True) if bad)
        actions = {r.action for r, bad in zip(rules, failing, strict=True) if bad}
        if "quarantine" in actions:
            out.append(RecordVerdict("quarantine", failed, dict(record), False))
        elif "reject" in actions:
            out.append(RecordVerdict("rejected", failed, dict(record), False))
        elif "enrich" in actions:  # the record path fills the value in, as the pipeline's sink does
            out.append(contract.validate_record(dict(record), references=references))
        else:
            out.append(RecordVerdict("valid", failed, dict(zip(columns, values, strict=True)), False))
    return out
