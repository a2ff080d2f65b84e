"""A use case's label: the training target (``Label``) and the values it can take (``LabelDomain``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import polars as pl

from keel.errors import FeatureSpecError

Task = Literal["binary", "regression"]


@dataclass(frozen=True)
class LabelDomain:
    """The values a regression label can take: at least ``lower``, at most ``upper`` (None: unbounded), whole
    numbers when ``integer`` — a count is never negative nor fractional. Answers and their intervals respect it
    (keel/intervals.py: a count's interval never goes below 0)."""

    lower: float | None = None
    upper: float | None = None
    integer: bool = False

    def __post_init__(self) -> None:
        if self.lower is not None and self.upper is not None and not self.lower < self.upper:
            raise FeatureSpecError(f"label domain [{self.lower}, {self.upper}]: lower must be under upper")

    def describe(self) -> str:
        lo = "−∞" if self.lower is None else f"{self.lower:g}"
        hi = "∞" if self.upper is None else f"{self.upper:g}"
        return f"{'integers' if self.integer else 'values'} in [{lo}, {hi}]"


@dataclass(frozen=True, eq=False)
class Label:
    """The training target: ``expr`` over the entity's source rows, stored as ``column``. ``known_after``: what a
    reader should know about when it is realized (for docs and the UI); ``classes``: the names of 0 and 1 of a
    binary label; ``domain``: the values a regression label can take (``LabelDomain``; None: any real number)."""

    column: str
    expr: pl.Expr
    task: Task
    known_after: str = ""
    classes: tuple[str, str] = ("0", "1")  # binary: what 0 and 1 mean, for explanations
    description: str = ""  # what the label means, shown in the feature table's schema
    domain: LabelDomain | None = None

    def __post_init__(self) -> None:
        if self.task not in ("binary", "regression"):
            raise FeatureSpecError(f"label {self.column}: task must be binary or regression, got {self.task!r}")
        if self.domain is not None and self.task != "regression":
            raise FeatureSpecError(f"label {self.column}: a domain is a regression label's (a binary one is 0 or 1)")
