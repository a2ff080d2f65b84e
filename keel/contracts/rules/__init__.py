"""Contract rule types, one module each, registered in ``RULES``.

A rule type says, in one place, everything keel does with its rules:

- ``keys`` and ``read``: the fields it takes in a contract file and how they are checked (errors name file, line and
  field through the reader), including which column types it applies to;
- ``reason``: the default reason a failing row gets;
- ``batch``: its violation as a polars expression over a partition (keel.contracts.engine);
- ``record``: the same verdict for one typed record in plain Python (keel.contracts.record), held equal to the batch
  path by property tests;
- ``sql``: its violation in Flink SQL for the streaming path (keel.streaming.contract_sql), or ``NoStreamForm``.

Adding a rule type is one module here (copy ``max_length.py``, the smallest; its base is ``base.RuleType``) and its
line in ``RULES`` below; the reader, both validation paths, the streaming compiler and ``keel contracts lint`` pick
it up.
"""

from __future__ import annotations

from keel.contracts.rules import (
    condition,
    decimal,
    freshness,
    in_set,
    max_length,
    not_null,
    parseable,
    range,
    regex,
    stuck,
    timestamp_parts,
    unique,
)
from keel.contracts.rules.base import BatchContext, NoStreamForm, RecordContext, RuleType

__all__ = ["RULES", "RULE_TYPES", "BatchContext", "NoStreamForm", "RecordContext", "RuleType"]


def _registry() -> dict[str, RuleType]:
    types = [
        not_null.NotNull(),
        parseable.Parseable(),
        range.Range(),
        in_set.InSet(),
        regex.Regex(),
        max_length.MaxLength(),
        decimal.Decimal(),
        freshness.Freshness(),
        unique.Unique(),
        stuck.Stuck(),
        condition.Condition(),
        timestamp_parts.TimestampParts(),
    ]
    return {t.name: t for t in types}


RULES: dict[str, RuleType] = _registry()
RULE_TYPES = tuple(RULES)
