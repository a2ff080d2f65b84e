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

import re
from dataclasses import dataclass

from keel.contracts.rules import RULES, NoStreamForm
from keel.contracts.spec import ContractSpec
from keel.contracts.values import sql_column, sql_string
from keel.errors import ContractError

SQL_TYPES = {
    "int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float32": "FLOAT",
    "float64": "DOUBLE", "string": "STRING", "bool": "BOOLEAN", "datetime": "TIMESTAMP(3)", "date": "DATE",
}  # fmt: skip
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
            whens = " ".join(f"WHEN `__m_{r.id}` THEN {sql_string(getattr(r, attr))}" for r in rules)
            return f"CASE {whens} END"

        failed = (
            ", ".join(f"CASE WHEN `__m_{r.id}` THEN {sql_string(r.id)} END" for r in self.rules)
            or "CAST(NULL AS STRING)"
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
    raw = f"NULLIF(TRIM({sql_column(name)}), '')"
    if dtype == "string":
        return f"{sql_column(name)}"
    if dtype == "datetime":
        pattern = java_pattern(fmt or "%Y-%m-%dT%H:%M:%S")
        return f"TO_TIMESTAMP({raw}, {sql_string(pattern)})"
    if dtype == "date":
        return f"TO_DATE({raw}, {sql_string(java_pattern(fmt or '%Y-%m-%d'))})"
    if dtype == "bool":
        low = f"LOWER({raw})"
        return (
            f"CASE WHEN {low} IN ('true', 't', 'yes', '1') THEN TRUE "
            f"WHEN {low} IN ('false', 'f', 'no', '0') THEN FALSE END"
        )
    return f"TRY_CAST({raw} AS {SQL_TYPES[dtype]})"


def compile_contract(spec: ContractSpec, *, skip: frozenset[str] | set[str] = frozenset()) -> StreamPlan:
    """The plan for ``spec``: its rules in the batch engine's order (so the first failing rule is the same one)."""
    from keel.contracts.engine import CompiledContract

    typed: list[str] = []
    for c in spec.columns:
        typed.append(f"{_typed(c.name, c.dtype, c.format)} AS {sql_column(c.name)}")
        typed.append(f"{sql_column(c.name)} AS `__raw_{c.name}`")
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
            v = f"{sql_column(rule.columns[0])} IS NULL"
        else:
            v = _rule_sql(spec, rule.spec, regex_rules)
        rules.append(StreamRule(rule.id, rule.action, rule.severity, rule.reason, f"COALESCE({v}, FALSE)"))
    return StreamPlan(spec, typed, rules, regex_rules)


def _rule_sql(spec: ContractSpec, r, regex_rules: list) -> str:
    p = r.params
    col = sql_column(p["column"]) if "column" in p else None
    dtype = spec.column(p["column"]).dtype if "column" in p else None
    try:
        return RULES[r.type].sql(r, col, dtype, regex_rules)
    except NoStreamForm:
        raise ContractError(
            f"rule '{r.id}' ({r.type}) has no streaming form: it needs the whole partition or another dataset; "
            "skip it in both paths (skip=…) or check that property in the batch path",
            source=spec.source,
        ) from None
