"""What every contract rule type is and may read (keel.contracts.rules registers them): the ``RuleType`` base, the
contexts of its batch and record forms, and ``NoStreamForm``. The rule modules import this, never the package."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol

import polars as pl

from keel.contracts.model import ColumnSpec, ContractSpec, RuleSpec

Path = tuple  # a YAML path, as keel.contracts.yamlpos spells it


class Reader(Protocol):
    """What a rule type uses of the contract reader (keel.contracts.spec): typed fields with positioned errors."""

    def fail(self, path: Path, message: str) -> Exception: ...

    def get(self, m: dict, key: str, path: Path, types: tuple, *, required: bool = False, default: Any = None): ...

    def choice(self, m: dict, key: str, path: Path, options: tuple[str, ...], default: str) -> str: ...


@dataclass(frozen=True)
class BatchContext:
    """What a batch violation may read besides its own parameters."""

    spec: ContractSpec
    ref_time: pl.Expr  # freshness: the partition's end (or now, or the batch's newest event)
    references: Mapping[str, pl.Series]  # in_set reference value sets, by "<dataset>.<column>"


@dataclass(frozen=True)
class RecordContext:
    """What a record check may read besides the rule's column value."""

    typed: dict[str, Any]  # the record, cast to the contract's types
    partition_end: datetime | None
    reference_set: Callable[[RuleSpec], set[Any]]  # in_set with a reference: its values, cast, as a set


class NoStreamForm(Exception):
    """The rule type has no streaming (row-at-a-time SQL) form: it needs the whole partition or another dataset."""


class RuleType:
    name: ClassVar[str]
    keys: ClassVar[frozenset[str]] = frozenset()  # the fields it takes besides id, type, severity, action, …
    # Column types its ``column`` may have (None: any), and how an error names them.
    column_types: ClassVar[frozenset[str] | None] = None
    column_need: ClassVar[str] = ""

    def read(self, r: Reader, m: dict, path: Path, columns: list[ColumnSpec]) -> dict[str, Any]:
        """The rule's parameters from its mapping ``m`` (``column`` is read before, when ``keys`` has it)."""
        return {}

    def check_column(self, r: Reader, path: Path, params: dict[str, Any], column: ColumnSpec) -> None:
        if self.column_types is not None and column.dtype not in self.column_types:
            raise r.fail(
                path + ("column",), f"a {self.name} rule needs {self.column_need}; '{column.name}' is {column.dtype}"
            )

    def reason(self, p: dict[str, Any]) -> str:
        raise NotImplementedError

    def prepare(self, rule: RuleSpec, spec: ContractSpec) -> Any:
        """Work done once per compiled contract, handed to ``batch`` and ``record`` (bounds as values, a parsed
        condition, a value set)."""
        return None

    def batch(self, rule: RuleSpec, prepared: Any, ctx: BatchContext) -> pl.Expr:
        raise NotImplementedError

    def record(self, value: Any, rule: RuleSpec, prepared: Any, ctx: RecordContext) -> bool:
        raise NotImplementedError

    def sql(self, rule: RuleSpec, col: str, dtype: str | None, regex_rules: list) -> str:
        raise NoStreamForm
