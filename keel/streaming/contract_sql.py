"""A data contract compiled to Flink SQL: typed columns, one violation predicate per rule, the sink decision.

The batch path (keel.contracts.engine, polars) and this one share the contract and its meaning: the same columns
are typed the same way (text trimmed and cast; a value that does not parse is a schema violation), each rule's
violation is the same predicate (SQL three-valued logic: a comparison with null passes, as in the batch path), the
same rule decides a row's sink (the first failing quarantine rule, in contract order; reject only when nothing
quarantines) and ``_failed_rules`` lists every failing rule. Rules that SQL cannot express safely — ``regex``
(Flink's REGEXP is a backtracking Java engine; user patterns run only on linear-time engines) — become a
vectorised Python UDF on flpc, the Rust regex engine the record path already uses.

Rules with no streaming form: ``unique`` and ``freshness`` are properties of a whole partition, ``parseable`` of a
second type and ``in_set`` with a ``reference`` of another dataset; ``compile_contract`` refuses them by name unless
``skip`` lists them (the caller then runs the batch path without them too, so the two stay comparable).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from keel.contracts.dsl import Node, parse_condition
from keel.contracts.spec import ContractSpec
from keel.errors import ContractError

SQL_TYPES = {
    "int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float32": "FLOAT",
    "float64": "DOUBLE", "string": "STRING", "bool": "BOOLEAN", "datetime": "TIMESTAMP(3)", "date": "DATE",
}  # fmt: skip
NO_STREAM_FORM = ("unique", "freshness", "parseable")
STRFTIME_TO_JAVA = {"%Y": "yyyy", "%m": "MM", "%d": "dd", "%H": "HH", "%M": "mm", "%S": "ss"}
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class StreamRule:
    id: str
    action: str  # quarantine | reject | flag | enrich
    severity: str
    reason: str
    violation: str  # SQL boolean, never null (COALESCE(…, FALSE))


@dataclass(frozen=True)
class StreamPlan:
    contract: ContractSpec
    typed: list[str]  # SELECT items over the raw (all-STRING) source: typed columns and raw copies
    rules: list[StreamRule]
    regex_rules: list[tuple[str, str, str]]  # (rule id, column, pattern) evaluated by the flpc UDF

    def select_sql(self, source: str, passthrough: tuple[str, ...] = ()) -> str:
        """typed → masks → the sink decision, as one query over ``source`` (a table of STRING columns plus
        _source_row BIGINT)."""
        masks = ",\n  ".join(f"{r.violation} AS `__m_{r.id}`" for r in self.rules)
        typed = ",\n  ".join(self.typed)
        q = [r for r in self.rules if r.action == "quarantine"]
        rj = [r for r in self.rules if r.action == "reject"]

        def first(rules: list[StreamRule], attr: str) -> str:
            if not rules:
                return "CAST(NULL AS STRING)"
            whens = " ".join(f"WHEN `__m_{r.id}` THEN {_str(getattr(r, attr))}" for r in rules)
            return f"CASE {whens} END"

        failed = (
            ", ".join(f"CASE WHEN `__m_{r.id}` THEN {_str(r.id)} END" for r in self.rules) or "CAST(NULL AS STRING)"
        )
        any_q = " OR ".join(f"`__m_{r.id}`" for r in q) or "FALSE"
        any_r = " OR ".join(f"`__m_{r.id}`" for r in rj) or "FALSE"
        cols = ", ".join(f"`{c}`" for c in self.contract.column_names)
        raws = ", ".join(f"`__raw_{c}`" for c in self.contract.column_names)
        extra = "".join(f"`{c}`, " for c in passthrough)
        return (
            f"SELECT _source_row, {extra}{cols}, {raws},\n"
            f"  CASE WHEN {any_q} THEN 'quarantine' WHEN {any_r} THEN 'rejected' ELSE 'valid' END AS _sink,\n"
            f"  {first(q, 'id')} AS _rule_id, {first(rj, 'id')} AS _reject_rule_id,\n"
            f"  NULLIF(CONCAT_WS(',', {failed}), '') AS _failed_rules,\n"
            f"  {first(q, 'severity')} AS _severity, {first(q, 'reason')} AS _reason\n"
            f"FROM (SELECT *,\n  {masks}\nFROM (SELECT _source_row, {extra}\n  {typed}\nFROM {source}))"
        )


def _str(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _lit(value: Any, dtype: str | None = None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ContractError(f"non-finite literal {value!r} has no SQL form")
        if dtype in ("float32", "float64") or isinstance(value, float):
            return f"CAST({float(value)!r} AS DOUBLE)"  # a bare 10.35 is a DECIMAL in Flink SQL
        return str(value)
    return _str(value)


def _col(name: str) -> str:
    if not IDENT.match(name):
        raise ContractError(f"column name {name!r} cannot be used in the streaming path")
    return f"`{name}`"


def java_pattern(fmt: str) -> str:
    """A strftime format as a Java DateTimeFormatter pattern (the subset contracts use); literal text quoted."""
    out, i = [], 0
    while i < len(fmt):
        two = fmt[i : i + 2]
        if two in STRFTIME_TO_JAVA:
            out.append(STRFTIME_TO_JAVA[two])
            i += 2
        elif fmt[i] == "%":
            raise ContractError(f"date format directive {two!r} has no streaming form (supported: %Y %m %d %H %M %S)")
        else:
            out.append("''" if fmt[i] == "'" else f"'{fmt[i]}'" if fmt[i].isalpha() else fmt[i])
            i += 1
    return "".join(out)


def _typed(name: str, dtype: str, fmt: str | None) -> str:
    raw = f"NULLIF(TRIM({_col(name)}), '')"
    if dtype == "string":
        return f"{_col(name)}"
    if dtype == "datetime":
        pattern = java_pattern(fmt or "%Y-%m-%dT%H:%M:%S")
        return f"TO_TIMESTAMP({raw}, {_str(pattern)})"
    if dtype == "date":
        return f"TO_DATE({raw}, {_str(java_pattern(fmt or '%Y-%m-%d'))})"
    if dtype == "bool":
        low = f"LOWER({raw})"
        return (
            f"CASE WHEN {low} IN ('true', 't', 'yes', '1') THEN TRUE "
            f"WHEN {low} IN ('false', 'f', 'no', '0') THEN FALSE END"
        )
    return f"TRY_CAST({raw} AS {SQL_TYPES[dtype]})"


def dsl_sql(node: Node) -> str:
    """The contract condition language in SQL (same three-valued meaning as its polars backend)."""
    op, a = node.op, node.args
    if op == "col":
        return _col(a[0])
    if op == "lit":
        return _lit(a[0])
    if op == "neg":
        return f"(-{dsl_sql(a[0])})"
    if op == "arith":
        left, right = dsl_sql(a[1]), dsl_sql(a[2])
        if a[0] == "/":
            return f"(CAST({left} AS DOUBLE) / NULLIF(CAST({right} AS DOUBLE), 0))"
        return f"({left} {a[0]} {right})"
    if op == "cmp":
        sym = {"==": "=", "!=": "<>"}.get(a[0], a[0])
        return f"({dsl_sql(a[1])} {sym} {dsl_sql(a[2])})"
    if op in ("and", "or"):
        return f"({dsl_sql(a[0])} {op.upper()} {dsl_sql(a[1])})"
    if op == "not":
        return f"(NOT {dsl_sql(a[0])})"
    if op == "isnull":
        return f"({dsl_sql(a[0])} IS NULL)"
    if op == "notnull":
        return f"({dsl_sql(a[0])} IS NOT NULL)"
    if op in ("in", "notin"):
        values = ", ".join(_lit(v) for v in a[1])
        return f"({dsl_sql(a[0])} {'NOT IN' if op == 'notin' else 'IN'} ({values}))"
    raise AssertionError(op)


def compile_contract(spec: ContractSpec, *, skip: frozenset[str] | set[str] = frozenset()) -> StreamPlan:
    """The plan for ``spec``: its rules in the batch engine's order (so the first failing rule is the same one)."""
    from keel.contracts.engine import CompiledContract

    typed: list[str] = []
    for c in spec.columns:
        typed.append(f"{_typed(c.name, c.dtype, c.format)} AS {_col(c.name)}")
        typed.append(f"{_col(c.name)} AS `__raw_{c.name}`")
    rules: list[StreamRule] = []
    regex_rules: list[tuple[str, str, str]] = []
    for rule in CompiledContract(spec).rules:
        if rule.id in skip:
            continue
        if rule.id == "schema_columns":
            continue  # the stream's source table has exactly the contract's columns: none can be missing
        if rule.spec is None and rule.id.startswith("schema_type_"):
            c = spec.column(rule.columns[0])
            if c.dtype == "string":
                continue  # text stays text (invalid UTF-8 cannot reach a Flink STRING)
            expr = _typed(c.name, c.dtype, c.format).replace(f"`{c.name}`", f"`__raw_{c.name}`")
            v = f"(`__raw_{c.name}` IS NOT NULL AND {expr} IS NULL)"
            if c.dtype in ("float32", "float64") and not c.allow_non_finite:
                # NaN is the one value unequal to itself; ±inf is beyond the largest double
                v = f"{v} OR `{c.name}` <> `{c.name}` OR ABS(`{c.name}`) > 1.7976931348623157E308"
        elif rule.spec is None and rule.id.startswith("schema_not_null_"):
            v = f"{_col(rule.columns[0])} IS NULL"
        else:
            v = _rule_sql(spec, rule.spec, regex_rules)
        rules.append(StreamRule(rule.id, rule.action, rule.severity, rule.reason, f"COALESCE({v}, FALSE)"))
    return StreamPlan(spec, typed, rules, regex_rules)


def _rule_sql(spec: ContractSpec, r, regex_rules: list) -> str:
    p = r.params
    col = _col(p["column"]) if "column" in p else None
    dtype = spec.column(p["column"]).dtype if "column" in p else None
    if r.type in NO_STREAM_FORM or (r.type == "in_set" and "reference" in p):
        raise ContractError(
            f"rule '{r.id}' ({r.type}) has no streaming form: it needs the whole partition or another dataset; "
            "skip it in both paths (skip=…) or check that property in the batch path",
            source=spec.source,
        )
    if r.type == "not_null":
        return f"{col} IS NULL"
    if r.type == "range":
        parts = []
        if p["min"] is not None:
            parts.append(f"{col} {'<' if p['min_inclusive'] else '<='} {_lit(p['min'], dtype)}")
        if p["max"] is not None:
            parts.append(f"{col} {'>' if p['max_inclusive'] else '>='} {_lit(p['max'], dtype)}")
        return " OR ".join(parts) or "FALSE"
    if r.type == "in_set":
        return f"{col} NOT IN ({', '.join(_lit(x, dtype) for x in p['values'])})"
    if r.type == "max_length":
        return f"CHAR_LENGTH({col}) > {int(p['max'])}"
    if r.type == "decimal":
        scaled = f"(CAST({col} AS DOUBLE) * {float(10 ** p['scale'])})"
        return (
            f"ABS({scaled} - ROUND({scaled}, 0)) > 1e-6 * GREATEST(1.0, ABS({scaled})) "
            f"OR ABS(CAST({col} AS DOUBLE)) >= {float(10 ** (p['precision'] - p['scale']))}"
        )
    if r.type == "condition":
        cond = parse_condition(p["expr"])
        check = f"({dsl_sql(cond.check)}) IS FALSE"
        return f"({dsl_sql(cond.guard)}) IS TRUE AND {check}" if cond.guard is not None else check
    if r.type == "regex":
        regex_rules.append((r.id, p["column"], p["pattern"]))
        return f"{col} IS NOT NULL AND NOT keel_regex_{len(regex_rules) - 1}({col})"
    raise ContractError(f"rule '{r.id}': type {r.type} has no streaming form", source=spec.source)
