"""Single-record validation for the serving path: the batch contract's verdict for one record in well under 1 ms.

A polars query costs ~10 µs per expression even on one row, and a real contract compiles to 50+ expressions, so a
record does not go through the batch plan. Each rule is evaluated in plain Python with polars' semantics instead,
and wherever those semantics are subtle (parsing text into numbers and timestamps, formatting floats as text,
regex matching) the record path calls polars itself on the one value, so the answer is polars' by construction.
Regexes therefore still run only on polars' linear-time engine. tests/contracts/test_properties.py checks on
random malformed rows that every record lands in the sink the batch puts it in.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import polars as pl

from keel.contracts.model import DTYPES, ColumnSpec, ContractSpec
from keel.contracts.results import SOURCE_ROW, CompiledRule, PartitionWindow, RecordVerdict
from keel.contracts.rules import RULES, RecordContext
from keel.contracts.values import cast_expr, polars_text, polars_value

_INT_RANGE = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_ASCII_INT = frozenset("0123456789")


class ByteBoundedCache:
    """An LRU memo bounded by the bytes of what it holds, not by its number of entries: serving traffic repeats small
    values (hours, codes, dates) worth keeping, while callers may send arbitrarily long ones, which are not kept."""

    ENTRY_OVERHEAD = 200  # bytes of bookkeeping counted per entry (key tuple, node, result object)

    def __init__(self, max_bytes: int, max_value_chars: int = 256):
        self.max_bytes, self.max_value_chars = max_bytes, max_value_chars
        self._items: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _size(value: Any) -> int:
        return len(value) if isinstance(value, str | bytes) else 16

    def get(self, key: tuple, compute: Any) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        result = compute()
        size = self._size(key[0]) + self.ENTRY_OVERHEAD
        if self._size(key[0]) > self.max_value_chars:
            return result
        with self._lock:
            if key not in self._items:
                self._items[key] = (result, size)
                self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped
        return result

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


CAST_CACHE = ByteBoundedCache(max_bytes=16 << 20)  # 16 MiB at most, whatever the traffic


def _cast_via_polars(value: Any, target: str, fmt: str | None) -> Any:
    """The batch cast of one value; memoised (bounded in bytes), since serving traffic repeats values."""

    def compute() -> Any:
        return polars_value(value, lambda c, dt: cast_expr(c, dt, target, fmt))

    try:
        hash(value)
    except TypeError:  # unhashable
        return compute()
    return CAST_CACHE.get((value, type(value), target, fmt), compute)


# Timestamp formats parsed in Python when the text is exactly the fixed-width ASCII digits they describe; any other
# text (or an impossible date, which Python rejects) goes to polars, so the result is polars' either way.
_FIXED_FORMATS = {
    "%Y-%m-%dT%H:%M:%SZ": "dddd-dd-ddTdd:dd:ddZ",
    "%Y-%m-%dT%H:%M:%S": "dddd-dd-ddTdd:dd:dd",
    "%Y-%m-%d %H:%M:%S": "dddd-dd-dd dd:dd:dd",
}


def _fast_datetime(text: str, fmt: str | None) -> datetime | None:
    shape = _FIXED_FORMATS.get(fmt or "%Y-%m-%dT%H:%M:%S")
    if shape is None or len(text) != len(shape):
        return None
    for ch, want in zip(text, shape, strict=True):
        if (want == "d" and ch not in _ASCII_INT) or (want != "d" and ch != want):
            return None
    try:
        return datetime(
            int(text[0:4]),
            int(text[5:7]),
            int(text[8:10]),
            int(text[11:13]),
            int(text[14:16]),
            int(text[17:19]),
            tzinfo=UTC,
        )
    except ValueError:
        return None


def _is_ascii_int(text: str) -> bool:
    body = text[1:] if text[:1] == "-" else text
    return 0 < len(body) <= 18 and all(ch in _ASCII_INT for ch in body)


def _is_ascii_decimal(text: str) -> bool:
    body = text[1:] if text[:1] == "-" else text
    whole, _, frac = body.partition(".")
    return (
        0 < len(whole) <= 15
        and all(ch in _ASCII_INT for ch in whole)
        and len(frac) <= 15
        and all(ch in _ASCII_INT for ch in frac)
        and (frac or "." not in body)
    )


def to_typed(value: Any, column: ColumnSpec) -> tuple[Any, bool]:
    """(typed value, type violation) for one value, with the batch path's casting rules."""
    t = column.dtype
    if value is None:
        return None, False
    if isinstance(value, (list, tuple, dict, set)):
        return None, True
    typed: Any
    if t == "string":
        typed = value if isinstance(value, str) else polars_text(value)
        return typed, typed is None or "\ufffd" in typed
    if isinstance(value, bool) and (t in _INT_RANGE or t in ("float32", "float64")):
        return None, True  # booleans are not numbers (cast_expr: the batch path refuses them too)
    if t in _INT_RANGE:
        lo, hi = _INT_RANGE[t]
        if isinstance(value, int):
            typed = value if lo <= value <= hi else None
        elif isinstance(value, float):
            typed = int(value) if math.isfinite(value) and value == round(value) and lo <= int(value) <= hi else None
        elif isinstance(value, str) and _is_ascii_int(value):
            typed = int(value) if lo <= int(value) <= hi else None
        else:
            typed = _cast_via_polars(value, t, column.format)
        return typed, typed is None
    if t in ("float32", "float64"):
        if t == "float64" and isinstance(value, (int, float)):
            typed = float(value)
        elif t == "float64" and isinstance(value, str) and _is_ascii_decimal(value):
            typed = float(value)
        else:
            typed = _cast_via_polars(value, t, column.format)
        if typed is None:
            return None, True
        return typed, (not column.allow_non_finite) and not math.isfinite(typed)
    if t == "bool":
        if isinstance(value, bool):
            return value, False
        if isinstance(value, (int, float)):
            typed = True if value == 1 else False if value == 0 else None
        else:
            typed = _cast_via_polars(value, t, column.format)
        return typed, typed is None
    if t == "datetime":
        if isinstance(value, datetime):
            typed = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            return typed, False
        if isinstance(value, (int, float)):
            return None, True
        typed = (
            _fast_datetime(value, column.format)
            if isinstance(value, str) and (column.format is None or "%z" not in column.format)
            else None
        )
        if typed is None:
            try:
                typed = _cast_via_polars(value, t, column.format)
            except ValueError:  # parsed by polars, not representable in Python (year 0): cast_expr nulls it too
                typed = None
        return typed, typed is None
    if t == "date":
        if isinstance(value, date) and not isinstance(value, datetime):
            return value, False
        if isinstance(value, (int, float)):
            return None, True
        typed = _cast_via_polars(value, t, column.format)
        return typed, typed is None
    raise AssertionError(t)


class RecordValidator:
    """Evaluates a compiled contract's rules on one record. Built once per contract; cheap per call."""

    def __init__(self, spec: ContractSpec, rules: Sequence[CompiledRule], prepared: Mapping[str, Any]):
        self.rules = tuple(rules)  # the compiled contract's rules, in order
        self.spec = spec
        self._columns = {c.name: c for c in self.spec.columns}
        self._prepared = prepared  # per rule, what its type prepared once (bounds, value sets, …)
        self._reference_sets: dict[tuple[str, int], tuple[pl.Series, set[Any]]] = {}

    def _reference_set(self, rule_id: str, ref: str, series: pl.Series) -> set[Any]:
        key = (ref, id(series))
        hit = self._reference_sets.get(key)
        if hit is None:
            column = next(r.params["column"] for r in self.spec.rules if r.id == rule_id)
            dtype = DTYPES[self._columns[column].dtype]
            hit = (series, set(series.cast(dtype, strict=False).drop_nulls().to_list()))
            self._reference_sets[key] = hit
        return hit[1]

    def validate(
        self, record: Mapping[str, Any], partition: PartitionWindow | None, references: Mapping[str, pl.Series] | None
    ) -> RecordVerdict:
        spec = self.spec
        absent = [r for r in spec.references if r not in (references or {})]
        if absent:
            from keel.errors import ContractError

            raise ContractError(
                f"contract '{spec.name}' checks values against {', '.join(absent)}: pass them as references",
                source=spec.source,
            )
        typed: dict[str, Any] = {}
        failed: list[str] = []
        missing = [c for c in spec.column_names if c not in record]
        unexpected = [k for k in record if k not in self._columns and k != SOURCE_ROW]
        fails: dict[str, bool] = {
            "schema_columns": bool(missing) or (bool(unexpected) and spec.unexpected_columns == "quarantine")
        }
        for c in spec.columns:
            value, bad = to_typed(record.get(c.name), c)
            typed[c.name] = value
            fails[f"schema_type_{c.name}".lower()] = bad
            if not c.nullable:
                fails[f"schema_not_null_{c.name}".lower()] = value is None
        end = None if partition is None else partition.end
        ctx = RecordContext(
            typed, end, lambda r: self._reference_set(r.id, r.params["reference"], references[r.params["reference"]])
        )
        for rule in spec.rules:
            p = rule.params
            v = typed.get(p["column"]) if "column" in p else None
            bad = RULES[rule.type].record(v, rule, self._prepared[rule.id], ctx)
            fails[rule.id] = bad
        failed = [r.id for r in self.rules if fails[r.id]]
        actions = {r.action for r in self.rules if fails[r.id]}
        if "quarantine" in actions:
            return RecordVerdict("quarantine", tuple(failed), dict(record), False)
        if "reject" in actions:
            return RecordVerdict("rejected", tuple(failed), dict(record), False)
        enriched = False
        for r in self.rules:
            if r.action != "enrich" or not fails[r.id]:
                continue
            e = r.spec.enrich
            enriched = True
            if e.md5_of:
                key = "|".join(polars_text(typed[c]) or "" for c in e.md5_of)
                typed[e.column] = e.prefix + hashlib.md5(key.encode("utf-8")).hexdigest()  # noqa: S324 - an id, not security
            else:
                typed[e.column] = polars_value(
                    e.value, lambda c, dt, e=e: c.cast(DTYPES[self._columns[e.column].dtype])
                )
        return RecordVerdict("valid", tuple(failed), typed, enriched)
