"""The three sinks' rows: the quarantine table (original values as text, which rule, why, for review and replay), the
rejected rows' record (row number and reason), and the valid rows with ``enrich`` rules' values filled in."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import polars as pl

from keel.contracts.model import ContractSpec
from keel.contracts.results import SOURCE_ROW, CompiledRule
from keel.contracts.values import to_text

MASK = "__fail__"  # prefix of the per-rule violation columns while validating
RAW = "__raw__"  # prefix of original values kept for the quarantine table

QUARANTINE_META_SCHEMA: dict[str, pl.DataType] = {
    "_contract": pl.String(),
    "_contract_version": pl.Int64(),
    "_contract_hash": pl.String(),
    "_rule_id": pl.String(),
    "_failed_rules": pl.String(),
    "_severity": pl.String(),
    "_reason": pl.String(),
    "_partition": pl.String(),
    SOURCE_ROW: pl.Int64(),
    "_extra_columns": pl.String(),
    "_replay_status": pl.String(),
    "_quarantined_at": pl.Datetime("us", "UTC"),
}
REJECTED_SCHEMA: dict[str, pl.DataType] = {
    SOURCE_ROW: pl.Int64(),
    "_rule_id": pl.String(),
    "_failed_rules": pl.String(),
    "_reason": pl.String(),
    "_partition": pl.String(),
}


def first_failing(rules: list[CompiledRule], attr: str) -> pl.Expr:
    return pl.coalesce(
        [pl.when(pl.col(MASK + r.id)).then(pl.lit(getattr(r, attr))) for r in rules] + [pl.lit(None, pl.String)]
    )


def failed_list(active: list[CompiledRule]) -> pl.Expr:
    return pl.concat_str(
        [pl.when(pl.col(MASK + r.id)).then(pl.lit(r.id)) for r in active], separator=",", ignore_nulls=True
    )


def quarantine_rows(
    spec: ContractSpec, rows: pl.DataFrame, partition_key: str | None, has_extra: bool, active: list[CompiledRule]
) -> pl.DataFrame:
    if rows.height == 0:
        return empty_quarantine(spec)
    q_rules = [r for r in active if r.action == "quarantine"]
    values = []
    for c in spec.column_names:
        src = RAW + c if (RAW + c) in rows.columns else c
        values.append(to_text(pl.col(src), rows.schema[src]).alias(c))
    meta = [
        pl.lit(spec.name).alias("_contract"),
        pl.lit(spec.version, pl.Int64).alias("_contract_version"),
        pl.lit(spec.content_hash).alias("_contract_hash"),
        first_failing(q_rules, "id").alias("_rule_id"),
        failed_list(active).alias("_failed_rules"),
        first_failing(q_rules, "severity").alias("_severity"),
        first_failing(q_rules, "reason").alias("_reason"),
        pl.lit(partition_key, pl.String).alias("_partition"),
        pl.col(SOURCE_ROW),
        (pl.col(RAW + "_extra") if has_extra else pl.lit(None, pl.String)).alias("_extra_columns"),
        pl.lit("pending").alias("_replay_status"),
        pl.lit(datetime.now(UTC)).cast(pl.Datetime("us", "UTC")).alias("_quarantined_at"),
    ]
    return rows.select(values + meta)


def empty_quarantine(spec: ContractSpec) -> pl.DataFrame:
    schema = {c: pl.String() for c in spec.column_names} | QUARANTINE_META_SCHEMA
    return pl.DataFrame(schema=schema)


def rejected_rows(rows: pl.DataFrame, partition_key: str | None, active: list[CompiledRule]) -> pl.DataFrame:
    if rows.height == 0:
        return pl.DataFrame(schema=REJECTED_SCHEMA)
    r_rules = [r for r in active if r.action == "reject"]
    return rows.select(
        pl.col(SOURCE_ROW),
        first_failing(r_rules, "id").alias("_rule_id"),
        failed_list(active).alias("_failed_rules"),
        first_failing(r_rules, "reason").alias("_reason"),
        pl.lit(partition_key, pl.String).alias("_partition"),
    )


def apply_enrichment(spec: ContractSpec, frame: pl.DataFrame, enrich_rules: list[CompiledRule]) -> pl.DataFrame:
    for rule in enrich_rules:
        assert rule.spec is not None and rule.spec.enrich is not None
        e = rule.spec.enrich
        mask = frame[MASK + rule.id]
        if not mask.any():
            continue
        target = spec.column(e.column).polars_dtype
        if e.md5_of:
            idx = mask.arg_true()
            keys = frame[idx].select(
                pl.concat_str([pl.col(c).cast(pl.String).fill_null("") for c in e.md5_of], separator="|").alias("k")
            )["k"]
            filled = [e.prefix + hashlib.md5(k.encode("utf-8")).hexdigest() for k in keys]  # noqa: S324 - an id, not security
            new = frame[e.column].cast(pl.String).scatter(idx, filled)
            frame = frame.with_columns(new.alias(e.column))
        else:
            frame = frame.with_columns(
                pl.when(pl.col(MASK + rule.id))
                .then(pl.lit(e.value).cast(target))
                .otherwise(pl.col(e.column))
                .alias(e.column)
            )
    return frame
