"""What validation produces: the partition window it ran for, the compiled rules, each rule's outcome, the report,
the three sinks, and the single-record verdict. Plain values, shared by the batch engine and the record path."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import polars as pl

from keel.contracts.model import RuleSpec

SOURCE_ROW = "_source_row"
ENRICHED = "_enriched"


@dataclass(frozen=True)
class PartitionWindow:
    """The partition being validated: its key and [start, end) in UTC (freshness is measured against end)."""

    key: str
    start: datetime | None = None
    end: datetime | None = None

    @classmethod
    def month(cls, key: str) -> PartitionWindow:
        """The monthly partition ``YYYY-MM``: [its first day, the next month's first day) in UTC."""
        import re
        from datetime import UTC

        if not isinstance(key, str) or not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", key):
            raise ValueError(f"partition {key!r}: a monthly partition is YYYY-MM (or give a PartitionWindow)")
        year, month = int(key[:4]), int(key[5:])
        start = datetime(year, month, 1, tzinfo=UTC)
        return cls(key, start, datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC))


@dataclass(frozen=True)
class CompiledRule:
    id: str
    type: str
    severity: str
    action: str
    reason: str
    columns: tuple[str, ...]
    max_failure_fraction: float
    spec: RuleSpec | None  # None for the schema rules keel derives from the schema


@dataclass
class RuleOutcome:
    id: str
    type: str
    severity: str
    action: str
    failed: int
    pass_rate: float
    max_failure_fraction: float
    reason: str
    columns: tuple[str, ...] = ()
    # A few failing rows: the source row number and the rule's columns as they arrived (text), for the UI.
    sample: list[dict[str, Any]] = field(default_factory=list)

    @property
    def within_threshold(self) -> bool:
        return self.failed == 0 or (1.0 - self.pass_rate) <= self.max_failure_fraction


@dataclass
class ValidationReport:
    contract: str
    contract_version: int
    contract_hash: str
    partition: str | None
    dry_run: bool
    rows_in: int
    valid: int
    quarantined: int
    rejected: int
    enriched: int
    flagged: int
    critical_failed_rows: int
    critical_budget_fraction: float
    missing_columns: list[str]
    unexpected_columns: list[str]
    rules: list[RuleOutcome]
    # What a real run would have done; equals the sinks above unless dry_run.
    planned: dict[str, int] = field(default_factory=dict)
    critical_budget_rows: int = 0  # rows that may break critical rules whatever the partition's size

    @property
    def budget_text(self) -> str:
        """The budget as a person reads it: "2.00% of the rows" or "2.00% of the rows or 1 row, the larger"."""
        share = f"{self.critical_budget_fraction:.2%} of the rows"
        rows = self.critical_budget_rows
        return f"{share} or {rows} row{'s' if rows != 1 else ''}, the larger" if rows else share

    @property
    def conserved(self) -> bool:
        return self.rows_in == self.valid + self.quarantined + self.rejected

    @property
    def critical_failed_fraction(self) -> float:
        return self.critical_failed_rows / self.rows_in if self.rows_in else 0.0

    @property
    def budget_exceeded(self) -> bool:
        return (
            self.critical_failed_fraction > self.critical_budget_fraction
            and self.critical_failed_rows > self.critical_budget_rows
        )

    def rule(self, rule_id: str) -> RuleOutcome:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["conserved"] = self.conserved
        out["critical_failed_fraction"] = self.critical_failed_fraction
        out["budget_exceeded"] = self.budget_exceeded
        return out

    def rules_markdown(self) -> str:
        lines = ["| rule | type | severity | action | failed | pass rate |", "|---|---|---|---|---:|---:|"]
        for r in self.rules:
            lines.append(f"| {r.id} | {r.type} | {r.severity} | {r.action} | {r.failed:,} | {r.pass_rate:.4%} |")
        return "\n".join(lines)


@dataclass
class ValidationResult:
    valid: pl.DataFrame
    quarantine: pl.DataFrame
    rejected: pl.DataFrame
    report: ValidationReport


@dataclass(frozen=True)
class RecordVerdict:
    """The single-record result: its sink, the rules it broke, and the (typed, enriched) record."""

    sink: str  # valid | quarantine | rejected
    failed_rules: tuple[str, ...]
    record: dict[str, Any]
    enriched: bool
