"""The contract engine: one partition in, three sinks out, every row accounted for.

``validate_frame`` is vectorised over a polars frame; ``validate_record`` gives one record the verdict the batch
would give it, evaluating the same rules in Python with polars' semantics (keel.contracts.record), held equal to
the batch path by property tests.

Every input row ends in exactly one sink:

- **quarantine** if any failing rule's action is ``quarantine`` (kept, with the reason, for review and replay);
- else **rejected** if any failing rule's action is ``reject`` (dropped; its row number and reason are kept);
- else **valid** — with ``enrich`` rules' values filled in (``_enriched`` is true) and ``flag`` rules counted.

Quarantine wins over reject because it loses nothing. In ``dry_run`` every row stays valid and unchanged; the report
says what a real run would have done.

Input columns need not have the contract's types: text is parsed, numbers are cast, and a value that does not fit
the declared type (``"1.5"`` in an int column, NaN/inf in a float column, text with invalid UTF-8 replaced by
U+FFFD when read, a nested value) fails the column's schema rule ``schema_type_<column>`` instead of crashing.
Missing contract columns fail ``schema_columns`` for every row; unexpected columns are dropped (and reported) or,
with ``unexpected_columns: quarantine``, quarantine every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import polars as pl

from keel.contracts.model import ContractSpec, RuleSpec
from keel.contracts.record import RecordValidator
from keel.contracts.results import (
    ENRICHED,
    SOURCE_ROW,
    CompiledRule,
    PartitionWindow,
    RecordVerdict,
    RuleOutcome,
    ValidationReport,
    ValidationResult,
)
from keel.contracts.rules import RULES, BatchContext
from keel.contracts.sinks import (
    MASK,
    RAW,
    REJECTED_SCHEMA,
    apply_enrichment,
    empty_quarantine,
    quarantine_rows,
    rejected_rows,
)
from keel.contracts.values import cast_expr
from keel.errors import ContractError

_REPLACEMENT_CHAR = "\ufffd"


@dataclass(frozen=True)
class _Stages:
    raw_keep: list[pl.Expr]
    typed_and_type_masks: list[pl.Expr]
    rule_masks: list[pl.Expr]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    references: dict[str, pl.Series]  # held so the ids in the cache key stay unique while cached
    active: frozenset[str]  # rules with a mask column; the others cannot fail on this input


class CompiledContract:
    """A contract turned into polars expressions once, reused for every partition and every record."""

    def __init__(self, spec: ContractSpec):
        self.spec = spec
        self.rules: list[CompiledRule] = self._schema_rules() + [self._user_rule(r) for r in spec.rules]
        self.prepared = {r.id: RULES[r.type].prepare(r, spec) for r in spec.rules}  # per rule type, once
        self._uses_now = any(r.params.get("relative_to") == "now" for r in spec.rules if r.type == "freshness")
        self._stage_cache: dict[tuple, _Stages] = {}
        self._record_validator: Any = None

    @property
    def rule_ids(self) -> list[str]:
        return [r.id for r in self.rules]

    # -- rule catalogue
    def _schema_rules(self) -> list[CompiledRule]:
        s = self.spec
        out = [
            CompiledRule(
                "schema_columns",
                "schema",
                s.schema_severity,
                s.schema_action,
                "a contract column is missing from the input"
                + (" or the input has unexpected columns" if s.unexpected_columns == "quarantine" else ""),
                (),
                0.0,
                None,
            )
        ]
        for c in s.columns:
            out.append(
                CompiledRule(
                    f"schema_type_{c.name}".lower(),
                    "schema",
                    s.schema_severity,
                    s.schema_action,
                    f"{c.name} is not a valid {c.dtype}" + ("" if c.dtype != "string" else " (invalid UTF-8)"),
                    (c.name,),
                    0.0,
                    None,
                )
            )
            if not c.nullable:
                out.append(
                    CompiledRule(
                        f"schema_not_null_{c.name}".lower(),
                        "schema",
                        s.schema_severity,
                        s.schema_action,
                        f"{c.name} is null but the schema says it is not nullable",
                        (c.name,),
                        0.0,
                        None,
                    )
                )
        return out

    @staticmethod
    def _user_rule(r: RuleSpec) -> CompiledRule:
        return CompiledRule(
            r.id,
            r.type,
            r.severity,
            r.action,
            RULES[r.type].reason(r.params),
            r.columns,
            r.max_failure_fraction,
            r,
        )

    # -- expressions
    def _typed_column(self, name: str, dtype: pl.DataType) -> tuple[pl.Expr, pl.Expr | None]:
        """(typed value, type-violation mask or None where no value can fail) for one column present as ``dtype``."""
        cspec = self.spec.column(name)
        target = cspec.polars_dtype
        src = pl.col(name)
        if dtype.is_nested() or dtype == pl.Object:
            return pl.lit(None, dtype=target), src.is_not_null()
        typed = cast_expr(src, dtype, cspec.dtype, cspec.format)
        # Same type in and out: nothing to parse, so nothing can fail to parse.
        parts = [] if dtype == target else [src.is_not_null() & typed.is_null()]
        if cspec.dtype in ("float32", "float64") and not cspec.allow_non_finite:
            parts.append(~typed.is_finite().fill_null(True))
        if cspec.dtype == "string":
            parts.append(typed.str.contains(_REPLACEMENT_CHAR, literal=True).fill_null(False))
        if not parts:
            return typed, None
        return typed, pl.any_horizontal(parts) if len(parts) > 1 else parts[0]

    def _rule_violation(self, rule: CompiledRule, ref_time: pl.Expr, references: Mapping[str, pl.Series]) -> pl.Expr:
        r = rule.spec
        assert r is not None
        return RULES[r.type].batch(r, self.prepared[r.id], BatchContext(self.spec, ref_time, references))

    def _freshness_reference(self, rule: CompiledRule, partition: PartitionWindow | None) -> pl.Expr:
        p = rule.spec.params if rule.spec else {}
        if p.get("relative_to") == "now":
            return pl.lit(datetime.now(UTC)).cast(pl.Datetime("us", "UTC"))
        if partition is not None and partition.end is not None:
            return pl.lit(partition.end).cast(pl.Datetime("us", "UTC"))
        # No partition window (a file from the CLI): measure against the newest event time in the batch.
        col = pl.col(p["column"])
        return col.cast(pl.Datetime("us", "UTC")).max()

    # -- the batch path
    def plan(
        self, df: pl.DataFrame, partition: PartitionWindow | None, references: Mapping[str, pl.Series] | None = None
    ) -> tuple[pl.LazyFrame, _Stages]:
        """A lazy frame with typed contract columns, raw originals where they differ, and a mask per rule that can fail.

        Rules that cannot fail on this input (a type check on a column that already has the type) get no column:
        ``stages.active`` names the rules that have one."""
        references = dict(references or {})
        absent = [r for r in self.spec.references if r not in references]
        if absent:
            raise ContractError(
                f"contract '{self.spec.name}' checks values against {', '.join(absent)}: pass them as references",
                source=self.spec.source,
            )
        stages = self._stages(tuple(df.schema.items()), partition, references)
        lf = df.lazy()
        if SOURCE_ROW not in df.schema:
            lf = lf.with_row_index(SOURCE_ROW).with_columns(pl.col(SOURCE_ROW).cast(pl.Int64))
        else:
            lf = lf.with_columns(pl.col(SOURCE_ROW).cast(pl.Int64, strict=False))
        if stages.raw_keep:
            lf = lf.with_columns(stages.raw_keep)
        lf = lf.with_columns(stages.typed_and_type_masks)
        if stages.unexpected:
            lf = lf.with_columns(pl.struct(stages.unexpected).struct.json_encode().alias(RAW + "_extra")).drop(
                stages.unexpected
            )
        lf = lf.with_columns(stages.rule_masks)
        return lf, stages

    def _stages(
        self,
        schema: tuple[tuple[str, pl.DataType], ...],
        partition: PartitionWindow | None,
        references: dict[str, pl.Series],
    ) -> _Stages:
        """The expressions for one input schema, built once and cached: the record path reuses them per call."""
        now_bucket = datetime.now(UTC).replace(microsecond=0) if self._uses_now else None
        key = (schema, partition, tuple((k, id(v)) for k, v in sorted(references.items())), now_bucket)
        cached = self._stage_cache.get(key)
        if cached is not None:
            return cached
        spec = self.spec
        dtypes = dict(schema)
        missing = tuple(c for c in spec.column_names if c not in dtypes)
        unexpected = tuple(c for c in dtypes if c not in spec.column_names and c != SOURCE_ROW)
        typed_exprs: list[pl.Expr] = []
        masks: list[pl.Expr] = []
        raw_keep: list[pl.Expr] = []
        schema_columns_fail = bool(missing) or (bool(unexpected) and spec.unexpected_columns == "quarantine")
        active = set()
        if schema_columns_fail:
            masks.append(pl.lit(True).alias(MASK + "schema_columns"))
            active.add("schema_columns")
        for c in spec.columns:
            if c.name in dtypes:
                dtype = dtypes[c.name]
                typed, bad = self._typed_column(c.name, dtype)
                if dtype != c.polars_dtype:
                    raw_keep.append(pl.col(c.name).alias(RAW + c.name))
                typed_exprs.append(typed.alias(c.name))
                if bad is not None:
                    masks.append(bad.alias(MASK + f"schema_type_{c.name}".lower()))
                    active.add(f"schema_type_{c.name}".lower())
            else:
                typed_exprs.append(pl.lit(None, dtype=c.polars_dtype).alias(c.name))
        rule_masks = []
        for rule in self.rules:
            if rule.spec is None:
                if rule.id.startswith("schema_not_null_"):
                    rule_masks.append(pl.col(rule.columns[0]).is_null().alias(MASK + rule.id))
                    active.add(rule.id)
                continue
            ref = self._freshness_reference(rule, partition) if rule.type == "freshness" else pl.lit(None)
            rule_masks.append(self._rule_violation(rule, ref, references).fill_null(False).alias(MASK + rule.id))
            active.add(rule.id)
        stages = _Stages(
            raw_keep, typed_exprs + masks, rule_masks, missing, unexpected, references, frozenset(active)
        )
        if len(self._stage_cache) >= 32:
            self._stage_cache.pop(next(iter(self._stage_cache)))
        self._stage_cache[key] = stages
        return stages

    def validate(
        self,
        df: pl.DataFrame,
        partition: PartitionWindow | str | None = None,
        *,
        dry_run: bool | None = None,
        references: Mapping[str, pl.Series] | None = None,
    ) -> ValidationResult:
        """Split ``df`` into valid / quarantine / rejected. ``partition``: a window, or a month's key ``YYYY-MM``;
        ``references`` maps ``<dataset>.<column>`` to its values."""
        partition = PartitionWindow.month(partition) if isinstance(partition, str) else partition
        spec = self.spec
        dry = spec.dry_run if dry_run is None else dry_run
        lf, stages = self.plan(df, partition, references)
        missing, unexpected = list(stages.missing), list(stages.unexpected)
        active = [r for r in self.rules if r.id in stages.active]

        def any_of(action: str) -> pl.Expr:
            cols = [pl.col(MASK + r.id) for r in active if r.action == action]
            return pl.any_horizontal(cols) if cols else pl.lit(False)

        critical = [pl.col(MASK + r.id) for r in active if r.severity == "critical"]
        lf = lf.with_columns(
            any_of("quarantine").alias("__q"),
            any_of("reject").alias("__r"),
            (pl.any_horizontal(critical) if critical else pl.lit(False)).alias("__crit"),
            any_of("flag").alias("__flag"),
        ).with_columns((pl.col("__r") & ~pl.col("__q")).alias("__r"))
        enrich_rules = [r for r in active if r.action == "enrich"]
        enrich_any = pl.any_horizontal([pl.col(MASK + r.id) for r in enrich_rules]) if enrich_rules else pl.lit(False)
        lf = lf.with_columns((enrich_any & ~pl.col("__q") & ~pl.col("__r")).alias("__e"))
        frame = lf.collect()

        counts = {r.id: 0 for r in self.rules} | frame.select(
            [pl.col(MASK + r.id).sum().alias(r.id) for r in active]
            + [pl.col(x).sum().alias(x) for x in ("__q", "__r", "__crit", "__e", "__flag")]
        ).row(0, named=True)
        n = frame.height
        planned = {
            "valid": n - counts["__q"] - counts["__r"],
            "quarantined": counts["__q"],
            "rejected": counts["__r"],
            "enriched": counts["__e"],
        }
        outcomes = [
            RuleOutcome(
                id=r.id,
                type=r.type,
                severity=r.severity,
                action=r.action,
                failed=int(counts[r.id]),
                pass_rate=1.0 - counts[r.id] / n if n else 1.0,
                max_failure_fraction=r.max_failure_fraction,
                reason=r.reason,
                columns=r.columns,
                sample=_failing_sample(frame, r) if counts[r.id] else [],
            )
            for r in self.rules
        ]
        partition_key = partition.key if partition else None
        contract_cols = list(spec.column_names)
        if dry:
            valid = frame.select(contract_cols + [SOURCE_ROW]).with_columns(pl.lit(False).alias(ENRICHED))
            quarantine = empty_quarantine(spec)
            rejected = pl.DataFrame(schema=REJECTED_SCHEMA)
        else:
            keep = ~pl.col("__q") & ~pl.col("__r")
            # Project before filtering: the mask columns are not copied into the outputs.
            valid_cols = contract_cols + [SOURCE_ROW, "__e"] + [MASK + r.id for r in enrich_rules]
            valid_frame = frame.lazy().filter(keep).select(valid_cols).collect()
            valid = apply_enrichment(spec, valid_frame, enrich_rules).select(
                contract_cols + [SOURCE_ROW, pl.col("__e").alias(ENRICHED)]
            )
            quarantine = quarantine_rows(spec, frame.filter(pl.col("__q")), partition_key, bool(unexpected), active)
            rejected = rejected_rows(frame.filter(pl.col("__r")), partition_key, active)
        report = ValidationReport(
            contract=spec.name,
            contract_version=spec.version,
            contract_hash=spec.content_hash,
            partition=partition_key,
            dry_run=dry,
            rows_in=n,
            valid=valid.height,
            quarantined=quarantine.height,
            rejected=rejected.height,
            enriched=int(valid[ENRICHED].sum()) if valid.height else 0,
            flagged=int(counts["__flag"]),
            critical_failed_rows=int(counts["__crit"]),
            critical_budget_fraction=spec.critical_budget_fraction,
            critical_budget_rows=spec.critical_budget_rows,
            missing_columns=missing,
            unexpected_columns=unexpected,
            rules=outcomes,
            planned=planned,
        )
        return ValidationResult(valid=valid, quarantine=quarantine, rejected=rejected, report=report)

    # -- the single-record path
    def validate_record(
        self,
        record: dict[str, Any],
        partition: PartitionWindow | None = None,
        references: Mapping[str, pl.Series] | None = None,
    ) -> RecordVerdict:
        """Validate one record with the batch semantics (see keel.contracts.record); ``unique`` cannot fail here."""
        if self._record_validator is None:
            self._record_validator = RecordValidator(self.spec, self.rules, self.prepared)
        return self._record_validator.validate(record, partition, references)


def validate_frame(
    spec: ContractSpec,
    df: pl.DataFrame,
    partition: PartitionWindow | None = None,
    *,
    dry_run: bool | None = None,
    references: Mapping[str, pl.Series] | None = None,
) -> ValidationResult:
    """Validate one frame against a contract (compiles it; reuse ``CompiledContract`` for many frames)."""
    return CompiledContract(spec).validate(df, partition, dry_run=dry_run, references=references)


# -- helpers ---------------------------------------------------------------------------------------------------


FAILING_SAMPLE_ROWS = 5


def _failing_sample(frame: pl.DataFrame, rule: CompiledRule) -> list[dict[str, Any]]:
    """Up to ``FAILING_SAMPLE_ROWS`` rows that fail ``rule``: source row and the rule's columns as they arrived."""
    columns = [c for c in rule.columns if (RAW + c) in frame.columns or c in frame.columns]
    rows = frame.filter(pl.col(MASK + rule.id)).head(FAILING_SAMPLE_ROWS)
    sources = [pl.col(RAW + c if (RAW + c) in frame.columns else c).alias(c) for c in columns]
    out = []
    for row in rows.select(pl.col(SOURCE_ROW), *sources).iter_rows(named=True):
        out.append(
            {k: (v if v is None or isinstance(v, (int, float, str, bool)) else str(v)) for k, v in row.items()}
        )
    return out
