"""Turn a contract file into Dagster assets and checks.

For a contract named ``<name>`` reading the raw asset ``raw_<name>``, ``contract_assets`` builds one multi-asset:

- ``validated_<name>``: rows that passed (typed, enriched where a rule enriches), the input of everything
  downstream;
- ``<name>_quarantine``: rows kept out, with contract version, rule id, reason, partition, source row number and
  replay status;

and its checks, evaluated in the same step on the same counts:

- ``conservation`` (blocking): rows in = valid + quarantined + rejected, exactly;
- ``critical_budget`` (blocking): rows breaking a critical rule stay within the contract's budget — when it fails,
  nothing downstream of ``validated_<name>`` runs;
- ``schema_conformance`` and one ``rule_<id>`` check per rule: the rule's pass rate against its allowed failure
  fraction (ERROR for critical rules, WARN for warnings; info rules report and always pass).

The contract's sha256 is the code_version of both assets, so editing the contract marks them, and everything
downstream, stale in the UI.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from keel.contracts.engine import CompiledContract, PartitionWindow, ValidationReport
from keel.contracts.model import RuleSpec
from keel.contracts.rules import RULES
from keel.contracts.spec import ContractSpec, load_contract
from keel.factories.checks import partitioned_check
from keel.factories.contract_alerts import breach_alerts, send_breach_alerts
from keel.factories.contract_metadata import (
    _column_metadata,
    checks_not_passed,
    failing_rows_table,
    quarantine_sample,
    rule_check_name,
    rules_table,
)

CONSERVATION_CHECK = "conservation"
BUDGET_CHECK = "critical_budget"
SCHEMA_CHECK = "schema_conformance"


def _key(prefix: str | None, name: str) -> dg.AssetKey:
    return dg.AssetKey([prefix, name] if prefix else [name])


def validated_key(name: str, prefix: str | None = None) -> dg.AssetKey:
    return _key(prefix, f"validated_{name}")


def quarantine_key(name: str, prefix: str | None = None) -> dg.AssetKey:
    return _key(prefix, f"{name}_quarantine")


def contract_check_specs(
    spec: ContractSpec, partitions_def: dg.PartitionsDefinition | None = None, key_prefix: str | None = None
) -> list[dg.AssetCheckSpec]:
    """The contract's checks. With the asset's ``partitions_def`` each result belongs to the partition it was
    evaluated on, so the asset's partitions view shows which months fail which rules."""
    key = validated_key(spec.name, key_prefix)
    specs = [
        partitioned_check(
            CONSERVATION_CHECK,
            asset=key,
            partitions_def=partitions_def,
            blocking=True,
            description="rows in = valid + quarantined + rejected, exactly",
        ),
        partitioned_check(
            BUDGET_CHECK,
            asset=key,
            partitions_def=partitions_def,
            blocking=True,
            description=f"rows breaking a critical rule ≤ {spec.critical_budget_fraction:.2%} of the partition"
            + (f" or {spec.critical_budget_rows:,} rows, the larger" if spec.critical_budget_rows else "")
            + "; blocks downstream",
        ),
        partitioned_check(
            SCHEMA_CHECK,
            asset=key,
            partitions_def=partitions_def,
            description="columns present, values of the declared types, non-nullable columns filled",
        ),
    ]
    for rule in spec.rules:
        specs.append(
            partitioned_check(
                rule_check_name(rule.id),
                asset=key,
                partitions_def=partitions_def,
                description=rule_check_description(rule),
            )
        )
    return specs


ACTION_WORDS = {
    "quarantine": "quarantined",
    "reject": "rejected",
    "flag": "flagged and kept",
    "enrich": "filled in and kept",
}


def rule_check_description(rule: RuleSpec) -> str:
    """What the rule's check says in the UI: the rule, its column and bounds, what happens to a failing row, when
    the check fails, and the contract's own words on why the rule exists."""
    reason = RULES[rule.type].reason(rule.params)
    if rule.severity == "info":
        verdict = "reports only (never fails)"
    else:
        kind = "fails" if rule.severity == "critical" else "warns"
        share = f"more than {rule.max_failure_fraction:.2%} of" if rule.max_failure_fraction else "any of"
        verdict = f"{kind} when {share} the partition's rows fail"
    text = f"{rule.id}: a row fails when {reason}; failing rows are {ACTION_WORDS[rule.action]}. The check {verdict}."
    return text + (f" Why: {' '.join(rule.description.split())}" if rule.description else "")


def _window(context: dg.AssetExecutionContext) -> PartitionWindow | None:
    if not context.has_partition_key:
        return None
    key = context.partition_key
    try:
        tw = context.partition_time_window
    except Exception:  # not a time-window partitions definition
        return PartitionWindow(key)
    return PartitionWindow(key, tw.start, tw.end)


def _partition_complete(context: dg.AssetExecutionContext, raw_key: dg.AssetKey) -> bool:
    """Whether the raw partition validated now is all of it: a live month is rebuilt as its days land, and its raw
    asset says ``month_complete``; anything else (a backfill, an unpartitioned table) is complete."""
    if not context.has_partition_key:
        return True
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=raw_key, asset_partitions=[context.partition_key]), limit=1
    ).records
    flag = records[0].asset_materialization.metadata.get("month_complete") if records else None
    return True if flag is None else bool(flag.value)


def _check_results(
    spec: ContractSpec, report: ValidationReport, key_prefix: str | None = None
) -> Iterator[dg.AssetCheckResult]:
    key = validated_key(spec.name, key_prefix)
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=CONSERVATION_CHECK,
        passed=report.conserved,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "rows_in": report.rows_in,
            "valid": report.valid,
            "quarantined": report.quarantined,
            "rejected": report.rejected,
        },
    )
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=BUDGET_CHECK,
        passed=not report.budget_exceeded,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "critical_failed_rows": report.critical_failed_rows,
            "critical_failed_fraction": dg.MetadataValue.float(round(report.critical_failed_fraction, 6)),
            "budget_fraction": dg.MetadataValue.float(report.critical_budget_fraction),
            "budget_rows": report.critical_budget_rows,
            "failing_critical_rules": ", ".join(r.id for r in report.rules if r.severity == "critical" and r.failed)
            or "none",
        },
    )
    schema_rules = [r for r in report.rules if r.type == "schema"]
    schema_failed = {r.id: r.failed for r in schema_rules if r.failed}
    yield dg.AssetCheckResult(
        asset_key=key,
        check_name=SCHEMA_CHECK,
        passed=not schema_failed,
        severity=dg.AssetCheckSeverity.ERROR if spec.schema_severity == "critical" else dg.AssetCheckSeverity.WARN,
        metadata={
            "missing_columns": ", ".join(report.missing_columns) or "none",
            "unexpected_columns": ", ".join(report.unexpected_columns) or "none",
            "failing_schema_rules": dg.MetadataValue.json(schema_failed),
        },
    )
    for rule in report.rules:
        if rule.type == "schema":
            continue
        passed = True if rule.severity == "info" else rule.within_threshold
        failed_fraction = 1.0 - rule.pass_rate
        yield dg.AssetCheckResult(
            asset_key=key,
            check_name=rule_check_name(rule.id),
            passed=passed,
            severity=dg.AssetCheckSeverity.ERROR if rule.severity == "critical" else dg.AssetCheckSeverity.WARN,
            description=f"{rule.failed:,} of {report.rows_in:,} rows fail: {rule.reason}"
            + (f" ({failed_fraction:.3%}; allowed {rule.max_failure_fraction:.3%})" if rule.failed else ""),
            metadata={
                "rule": rule.reason,
                "failed_rows": rule.failed,
                "failed_fraction": dg.MetadataValue.float(round(failed_fraction, 6)),
                "allowed_failure_fraction": dg.MetadataValue.float(rule.max_failure_fraction),
                "action": rule.action,
                "severity": rule.severity,
                **({"failing_rows": failing_rows_table(rule)} if rule.sample else {}),
            },
        )


def contract_assets(
    contract_path: str | Path,
    *,
    raw_key: dg.AssetKey | str,
    partitions_def: dg.PartitionsDefinition | None = None,
    group_name: str = "contracts",
    io_manager_key: str = "io_manager",
    reference_keys: dict[str, dg.AssetKey] | None = None,
    key_prefix: str | None = None,
) -> dg.AssetsDefinition:
    """Build ``validated_<name>`` and ``<name>_quarantine`` (and their checks) from a contract file.

    ``reference_keys`` maps a dataset named in an ``in_set`` rule's ``reference`` to the asset holding it
    (default: ``raw_<dataset>``); it becomes an input, so the dependency shows in the lineage. ``key_prefix``: the
    use case's name, the first part of every key built here (``<prefix>/validated_<name>``).
    """
    spec = load_contract(contract_path)
    compiled = CompiledContract(spec)
    raw_key = dg.AssetKey(raw_key) if isinstance(raw_key, str) else raw_key
    name = spec.name
    tags = {"keel/contract": name}
    common: dict[str, Any] = dict(
        group_name=group_name, code_version=spec.content_hash, io_manager_key=io_manager_key, tags=tags
    )

    ref_datasets = sorted({ref.split(".", 1)[0] for ref in spec.references})
    ref_keys = {ds: (reference_keys or {}).get(ds, _key(key_prefix, f"raw_{ds}")) for ds in ref_datasets}
    ins = {"raw": dg.AssetIn(key=raw_key)} | {f"ref_{ds}": dg.AssetIn(key=key) for ds, key in ref_keys.items()}

    @dg.multi_asset(
        name=f"{key_prefix}__validate_{name}" if key_prefix else f"validate_{name}",
        outs={
            "valid": dg.AssetOut(
                key=validated_key(name, key_prefix),
                metadata=_column_metadata(spec, raw_key, ref_keys),
                description=f"{spec.description.strip()}\n\nRows of `{raw_key.to_user_string()}` that pass contract "
                f"'{name}' v{spec.version} ({len(spec.rules)} rules), typed as the contract declares.",
                kinds={"polars", "parquet"},
                **common,
            ),
            "quarantine": dg.AssetOut(
                key=quarantine_key(name, key_prefix),
                description=f"Rows of `{raw_key.to_user_string()}` kept out by contract '{name}': original values as text plus "
                "contract version/hash, rule id, reason, partition, source row number and replay status.",
                kinds={"polars", "parquet"},
                **common,
            ),
        },
        ins=ins,
        partitions_def=partitions_def,
        check_specs=contract_check_specs(spec, partitions_def, key_prefix),
        description=f"Apply data contract '{name}' ({Path(contract_path).name})",
    )
    def _validate(context: dg.AssetExecutionContext, raw: pl.DataFrame, **refs: pl.DataFrame) -> Iterator[Any]:
        references = {}
        for ref in spec.references:
            dataset, column = ref.split(".", 1)
            frame = refs[f"ref_{dataset}"]
            if column not in frame.columns:
                raise KeyError(
                    f"contract '{name}' references {ref}, but {ref_keys[dataset].to_user_string()} has no column '{column}'"
                )
            references[ref] = frame[column]
        result = compiled.validate(raw, _window(context), references=references)
        rep = result.report
        context.log.info(
            f"contract {name} v{spec.version} on {rep.partition or 'all rows'}: {rep.rows_in:,} in → {rep.valid:,} valid "
            f"({rep.enriched:,} enriched), {rep.quarantined:,} quarantined, {rep.rejected:,} rejected"
        )
        for r in rep.rules:
            if r.failed and r.action == "reject":
                context.log.warning(f"rejected {r.failed:,} rows: rule {r.id}: {r.reason}")
        yield dg.Output(
            result.valid,
            output_name="valid",
            metadata={
                "rows_in": rep.rows_in,
                "valid": rep.valid,
                "quarantined": rep.quarantined,
                "rejected": rep.rejected,
                "enriched": rep.enriched,
                "flagged": rep.flagged,
                "critical_failed_fraction": dg.MetadataValue.float(round(rep.critical_failed_fraction, 6)),
                "contract_version": spec.version,
                "contract_hash": spec.content_hash,
                "checks_not_passed": checks_not_passed(rep),
                "per_rule": rules_table(rep),
                "dagster/row_count": rep.valid,
            },
        )
        yield dg.Output(
            result.quarantine,
            output_name="quarantine",
            metadata={
                "quarantined": rep.quarantined,
                "by_rule": dg.MetadataValue.table(
                    records=[
                        dg.TableRecord({"rule": rule_id, "rows": n})
                        for rule_id, n in result.quarantine.group_by("_rule_id")
                        .len()
                        .sort("len", descending=True)
                        .iter_rows()
                    ],
                    schema=dg.TableSchema(columns=[dg.TableColumn("rule", "string"), dg.TableColumn("rows", "int")]),
                ),
                "sample": quarantine_sample(spec, result.quarantine),
                "contract_version": spec.version,
                "dagster/row_count": rep.quarantined,
            },
        )
        yield from _check_results(spec, rep, key_prefix)
        send_breach_alerts(spec, rep, context.log, complete=_partition_complete(context, raw_key))

    return _validate


__all__ = ["BUDGET_CHECK", "CONSERVATION_CHECK", "SCHEMA_CHECK", "breach_alerts", "contract_assets"]
