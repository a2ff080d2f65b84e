"""The values ``keel new`` decides (keel/new/plan.py makes them, keel/new/render.py writes them): a ``Plan`` and its
parts, and the ``Options`` a person gives."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

COMMON_NULLS = 0.1  # a column missing in this share of rows or more: its absence is usual (an info rule counts it)
MAX_CATEGORIES = 50  # a text column with more distinct values is an id or free text: not a feature, no set rule
ADDED = ("event_year", "event_month", "event_day", "event_date")  # what the generated reader adds


class PlanError(ValueError):
    """The table and options cannot make a use case (a missing label, a label of the wrong kind, …)."""


@dataclass(frozen=True)
class Rule:
    id: str
    fields: dict  # the rule's YAML fields after id (type, column, …)
    why: str  # the comment above it in the contract: what the profile showed
    failing: int = 0  # rows of the profiled table it fails

    @property
    def action(self) -> str:
        return self.fields.get(
            "action", "quarantine" if self.fields.get("severity", "critical") == "critical" else "flag"
        )


@dataclass(frozen=True)
class SchemaColumn:
    ident: str
    type: str
    nullable: bool
    fmt: str | None = None
    description: str = ""
    derived: str | None = None  # a column the reader adds: row_number | timestamp_part (keel.contracts.derived)


@dataclass(frozen=True)
class FeatureChoice:
    name: str
    dtype: str  # int | float
    source: str  # the request feature's expression over col/ops, as code
    lo: float
    hi: float
    default: float
    description: str


@dataclass(frozen=True)
class HistoryChoice:
    name: str
    key: str
    description: str


@dataclass(frozen=True)
class Plan:
    name: str
    table: str
    model: str
    task: str
    label: str  # the label column's identifier
    positive: str | None  # a binary label's positive value (as text), None for a regression or a 0/1 label
    time: str
    time_fmt: str
    entity: tuple[str, ...]
    tier: str
    renames: dict[str, str]  # column as written → identifier (only those that differ)
    null_tokens: tuple[str, ...]
    schema: tuple[SchemaColumn, ...]
    rules: tuple[Rule, ...]
    critical_share: float
    defects: tuple[str, ...]  # the real defects found, each with what handles it
    features: tuple[FeatureChoice, ...]
    histories: tuple[HistoryChoice, ...]
    prior: float  # the label's mean over the first model's months (histories start from it)
    categories: tuple[str, ...]  # category columns: history keys, carried, monitored as categories
    flags: tuple[str, ...]  # 0/1 features: monitored as categories
    months: tuple[str, ...]
    first_day: str
    last_day: str
    train_months: tuple[str, ...]
    valid_month: str
    gate_min_rows: int
    rps: float
    ignored: dict[str, str] = field(default_factory=dict)  # column → why it is no feature
    null_columns: tuple[str, ...] = ()  # the columns whose null_tokens the reader reads as null
    # drift is judged at this distance instead of the defaults when a month's rows are few (sampling noise alone
    # exceeds them), None when the defaults fit; drift_noise: the distance two samples of one distribution show
    drift_threshold: float | None = None
    drift_noise: float = 0.0
    month_rows: int = 0  # a typical month's rows (the median of the months with rows)
    reference_rows: int = 0  # the rows of the first model's months
    train_rows: int = 0  # the rows of the first model's training months
    min_data_in_leaf: int | None = None  # LightGBM's, where keel's default (50) is too many for the training rows
    # rows a month may break critical rules on whatever its size (the budget's floor), and why: where the share of the
    # smallest month is under one row, one bad row would block that month
    critical_rows: int = 0
    critical_rows_why: str = ""
    # a regression label's domain from its profile — (lower, upper, integer), and why — None for a binary label
    label_domain: tuple[float | None, float | None, bool] | None = None
    label_domain_why: str = ""
    # no entity and one row per time instant: the time is the key a caller has (never the file's row number); and
    # the columns that are a part of the time (an hour column): column → part, held to the time in both contracts
    time_key: bool = False
    time_parts: dict[str, str] = field(default_factory=dict)

    @property
    def keyed_by_row(self) -> bool:
        """Rows keyed by their number in the file: no entity, and the time is no key (several rows an instant)."""
        return not self.entity and not self.time_key

    @property
    def request_columns(self) -> tuple[str, ...]:
        inputs = [c for f in self.features for c in _inputs(f.source)]
        cols = ["event_date", self.time, *self.entity, *self.categories, *inputs]
        if self.keyed_by_row:
            cols.insert(2, "row_ref")
        return tuple(dict.fromkeys(cols))


def _inputs(source: str) -> list[str]:
    return [m for m in re.findall(r'col\("([a-z0-9_]+)"\)', source) if m != "event_date"]


@dataclass(frozen=True)
class Options:
    name: str
    label: str
    time: str
    entity: tuple[str, ...] = ()
    task: str | None = None  # binary | regression; None: from the label
    positive: str | None = None
    months: int = 24
    tier: str = "L2"
