"""What a contract is, as values: column and rule specs, the contract, and the checks on single values of contract
text (durations, regexes, ISO timestamps) that the YAML reader (spec.py) and the rule types (rules/) share."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import polars as pl

DERIVED = ("", "row_number", "timestamp_part")  # what a schema column's ``derived`` may say ("": not derived)
DTYPES: dict[str, pl.DataType] = {
    "int8": pl.Int8(),
    "int16": pl.Int16(),
    "int32": pl.Int32(),
    "int64": pl.Int64(),
    "float32": pl.Float32(),
    "float64": pl.Float64(),
    "string": pl.String(),
    "bool": pl.Boolean(),
    "date": pl.Date(),
    "datetime": pl.Datetime("us", "UTC"),
}
NUMERIC = {"int8", "int16", "int32", "int64", "float32", "float64"}

SEVERITIES = ("critical", "warning", "info")
ACTIONS = ("quarantine", "reject", "enrich", "flag")
# keel-owned fixed patterns over contract text (not user patterns over data).
RULE_ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DURATION = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    dtype: str
    nullable: bool = True
    format: str | None = None  # strptime format for date/datetime parsed from text
    allow_non_finite: bool = False  # NaN/inf in a float column are type violations unless allowed
    description: str = ""
    # A column a pipeline's reader adds, which a file as delivered does not carry: ``row_number`` (the row's number in
    # the file) or ``timestamp_part`` (a part of a timestamp, named by a timestamp_parts rule's ``parts``). Validating
    # a file without it derives it (keel.contracts.derived) instead of failing every row.
    derived: str | None = None

    @property
    def polars_dtype(self) -> pl.DataType:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class Enrichment:
    """What an ``enrich`` rule writes into a failing row: a constant, or ``prefix + md5(columns)``."""

    column: str
    value: Any = None
    prefix: str = ""
    md5_of: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuleSpec:
    id: str
    type: str
    severity: str
    action: str
    params: dict[str, Any]
    description: str = ""
    enrich: Enrichment | None = None
    # The per-rule check fails when more than this fraction of rows violate the rule.
    max_failure_fraction: float = 0.0
    line: int | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        if "columns" in self.params:
            return tuple(self.params["columns"])
        if "column" in self.params:
            return (self.params["column"],)
        return tuple(sorted(self.params.get("_condition_columns", ())))


@dataclass(frozen=True)
class ContractSpec:
    name: str
    version: int
    description: str
    owner: str
    columns: tuple[ColumnSpec, ...]
    rules: tuple[RuleSpec, ...]
    schema_severity: str = "critical"
    schema_action: str = "quarantine"
    unexpected_columns: str = "drop"  # drop | quarantine
    critical_budget_fraction: float = 0.0
    critical_budget_rows: int = 0  # so many rows may break critical rules whatever the partition's size
    dry_run: bool = False
    source: str = "<string>"
    text: str = field(default="", repr=False)

    @property
    def content_hash(self) -> str:
        """sha256 of the contract file's bytes: the assets' code_version, so an edit marks downstream stale."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def references(self) -> tuple[str, ...]:
        """``<dataset>.<column>`` value sets that in_set rules read from other datasets."""
        return tuple(sorted({r.params["reference"] for r in self.rules if "reference" in r.params}))

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


def parse_duration(text: Any) -> timedelta:
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        raise ValueError(f"expected a duration such as '36h' or '32d', got {text!r}")
    m = _DURATION.match(text.strip())
    assert m is not None
    return timedelta(**{_DURATION_UNITS[m.group(2)]: int(m.group(1))})


def is_iso(value: Any, dtype: str) -> bool:
    from datetime import date, datetime

    if not isinstance(value, str):
        return False
    try:
        (date.fromisoformat if dtype == "date" else datetime.fromisoformat)(value)
    except ValueError:
        return False
    return True


def regex_error(pattern: str) -> str | None:
    """Compile ``pattern`` with both linear-time engines keel runs it on: polars (batches) and flpc (single
    records), both the Rust ``regex`` crate. Python's ``re`` never sees a user pattern."""
    import flpc

    try:
        flpc.compile(pattern)
    except Exception as exc:  # flpc raises ValueError with the crate's message
        lines = [ln for ln in str(exc).splitlines() if ln.startswith("error:")]
        return (
            lines[0][len("error:") :].strip() if lines else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        )
    try:
        pl.Series("p", [""], dtype=pl.String).str.contains(pattern)
    except Exception as exc:  # polars raises ComputeError with the engine's message
        for line in str(exc).splitlines():
            if line.startswith("error:"):
                return line[len("error:") :].strip()
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


_TYPE_NAMES = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
}


def kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def type_names(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
