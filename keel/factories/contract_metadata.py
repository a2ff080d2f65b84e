"""What a contract's validation shows in the UI: tables of rules, failing rows, a quarantine sample, the column
schema and lineage of the validated asset."""

from typing import Any

import dagster as dg
import polars as pl

from keel.contracts.engine import ValidationReport
from keel.contracts.results import SOURCE_ROW, RuleOutcome
from keel.contracts.spec import ContractSpec

QUARANTINE_SAMPLE_COLUMNS = ("_rule_id", "_reason", "_source_row")


def rule_check_name(rule_id: str) -> str:
    return f"rule_{rule_id}"


def failing_rows_table(rule: RuleOutcome) -> dg.TableMetadataValue:
    """A few rows that fail ``rule``: the source row and the rule's columns as they arrived."""
    columns = [SOURCE_ROW, *(c for c in rule.columns if c in rule.sample[0])]
    return dg.MetadataValue.table(
        records=[dg.TableRecord({c: row.get(c) for c in columns}) for row in rule.sample],
        schema=dg.TableSchema(
            columns=[dg.TableColumn(SOURCE_ROW, "int", description="row number in the delivery")]
            + [dg.TableColumn(c, "string") for c in columns[1:]]
        ),
    )


def checks_not_passed(report: ValidationReport) -> str:
    """The rule checks this partition failed or warned on, with what failed — on the materialization, so that the
    partition's own page (which lists no check results) says it."""
    out = [
        f"{rule_check_name(r.id)} ({r.failed:,} row{'s' if r.failed != 1 else ''}: {r.reason})"
        for r in report.rules
        if r.type != "schema" and r.severity != "info" and not r.within_threshold
    ]
    return "; ".join(out) or "none"


def rules_table(report: ValidationReport) -> dg.TableMetadataValue:
    """One row per rule: what it tests, what it did to this partition — rules with failing rows first, then the
    contract's rules, then the schema's. A table Dagster renders and sorts."""
    ordered = sorted(report.rules, key=lambda r: (r.failed == 0, r.type == "schema"))
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "rule": r.id,
                    "test": r.reason,
                    "severity": r.severity,
                    "action": r.action,
                    "failed_rows": r.failed,
                    "pass_rate": round(r.pass_rate, 6),
                }
            )
            for r in ordered
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("rule", "string"),
                dg.TableColumn("test", "string", description="a row fails when…"),
                dg.TableColumn("severity", "string"),
                dg.TableColumn("action", "string", description="what happens to a failing row"),
                dg.TableColumn("failed_rows", "int"),
                dg.TableColumn("pass_rate", "float"),
            ]
        ),
    )


def quarantine_sample(spec: ContractSpec, quarantine: pl.DataFrame, rows: int = 10) -> dg.TableMetadataValue:
    """The first quarantined rows, the failing rule's columns first (so the bad value is in view), then the rest."""
    sample = quarantine.head(rows)
    rule_columns: list[str] = []
    by_id = {r.id: r for r in spec.rules}
    for rule_id in sample["_rule_id"].drop_nulls().unique(maintain_order=True):
        rule = by_id.get(rule_id)
        rule_columns += [c for c in (rule.columns if rule else ()) if c not in rule_columns]
    columns = [c for c in QUARANTINE_SAMPLE_COLUMNS if c in sample.columns]
    columns += rule_columns + [c for c in spec.column_names if c not in rule_columns]
    return dg.MetadataValue.table(
        records=[dg.TableRecord(row) for row in sample.select(columns).iter_rows(named=True)],
        schema=dg.TableSchema(columns=[dg.TableColumn(c, "int" if c == SOURCE_ROW else "string") for c in columns]),
    )


def _column_metadata(spec: ContractSpec, raw_key: dg.AssetKey, ref_keys: dict[str, dg.AssetKey]) -> dict[str, Any]:
    """The contract's columns as the asset's schema and column lineage: each typed column comes from the raw column
    of its name, and from every reference column an ``in_set`` rule reads (a reference decides which rows pass)."""
    references = [
        dg.TableColumnDep(asset_key=ref_keys[ref.split(".", 1)[0]], column_name=ref.split(".", 1)[1])
        for ref in sorted(spec.references)
    ]
    return {
        "dagster/column_schema": dg.TableSchema(
            columns=[
                dg.TableColumn(
                    c.name,
                    c.dtype,
                    description=c.description or None,
                    constraints=dg.TableColumnConstraints(nullable=c.nullable),
                )
                for c in spec.columns
            ]
        ),
        "dagster/column_lineage": dg.TableColumnLineage(
            deps_by_column={
                c.name: [dg.TableColumnDep(asset_key=raw_key, column_name=c.name), *references] for c in spec.columns
            }
        ),
        "keel/contract_sha256": spec.content_hash,
    }
