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

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl

from keel.contracts.dsl import parse_condition
from keel.contracts.spec import ContractSpec, RuleSpec
from keel.errors import ContractError

SOURCE_ROW = "_source_row"
ENRICHED = "_enriched"
_MASK = "__fail__"  # prefix of the per-rule violation columns while validating
_RAW = "__raw__"  # prefix of original values kept for the quarantine table
_REPLACEMENT_CHAR = "\ufffd"

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


@dataclass(frozen=True)
class PartitionWindow:
    """The partition being validated: its key and [start, end) in UTC (freshness is measured against end)."""

    key: str
    start: datetime | None = None
    end: datetime | None = None


@dataclass(frozen=True)
class CompiledRule:
    id: str
    type: str
    severity: str
    action: str
    reason: str
    columns: tuple[str, ...]
    max_failure_fraction: float
    spec: RuleSpec | None  # None for the schema rules keel derives from the schema


@dataclass
class RuleOutcome:
    id: str
    type: str
    severity: str
    action: str
    failed: int
    pass_rate: float
    max_failure_fraction: float
    reason: str

    @property
    def within_threshold(self) -> bool:
        return self.failed == 0 or (1.0 - self.pass_rate) <= self.max_failure_fraction


@dataclass
class ValidationReport:
    contract: str
    contract_version: int
    contract_hash: str
    partition: str | None
    dry_run: bool
    rows_in: int
    valid: int
    quarantined: int
    rejected: int
    enriched: int
    flagged: int
    critical_failed_rows: int
    critical_budget_fraction: float
    missing_columns: list[str]
    unexpected_columns: list[str]
    rules: list[RuleOutcome]
    # What a real run would have done; equals the sinks above unless dry_run.
    planned: dict[str, int] = field(default_factory=dict)

    @property
    def conserved(self) -> bool:
        return self.rows_in == self.valid + self.quarantined + self.rejected

    @property
    def critical_failed_fraction(self) -> float:
        return self.critical_failed_rows / self.rows_in if self.rows_in else 0.0

    @property
    def budget_exceeded(self) -> bool:
        return self.critical_failed_fraction > self.critical_budget_fraction

    def rule(self, rule_id: str) -> RuleOutcome:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["conserved"] = self.conserved
        out["critical_failed_fraction"] = self.critical_failed_fraction
        out["budget_exceeded"] = self.budget_exceeded
        return out

    def rules_markdown(self) -> str:
        lines = ["| rule | type | severity | action | failed | pass rate |", "|---|---|---|---|---:|---:|"]
        for r in self.rules:
            lines.append(f"| {r.id} | {r.type} | {r.severity} | {r.action} | {r.failed:,} | {r.pass_rate:.4%} |")
        return "\n".join(lines)


@dataclass
class ValidationResult:
    valid: pl.DataFrame
    quarantine: pl.DataFrame
    rejected: pl.DataFrame
    report: ValidationReport


@dataclass(frozen=True)
class RecordVerdict:
    """The single-record result: its sink, the rules it broke, and the (typed, enriched) record."""

    sink: str  # valid | quarantine | rejected
    failed_rules: tuple[str, ...]
    record: dict[str, Any]
    enriched: bool


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
        self._conditions = {
            r.id: parse_condition(r.params["expr"]).violation for r in spec.rules if r.type == "condition"
        }
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
            r.description or _default_reason(r),
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
        typed = _cast_expr(src, dtype, cspec.dtype, cspec.format)
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
        p = r.params
        c = pl.col(p["column"]) if "column" in p else None
        if r.type == "not_null":
            return c.is_null()
        if r.type == "parseable":
            as_text = c.cast(pl.String)
            return c.is_not_null() & _cast_expr(as_text, pl.String(), p["as"], p.get("format")).is_null()
        if r.type == "range":
            dtype = self.spec.column(p["column"]).dtype
            bad = pl.lit(False)
            if p["min"] is not None:
                lo = _literal_for(p["min"], dtype)
                bad = bad | ((c < lo) if p["min_inclusive"] else (c <= lo))
            if p["max"] is not None:
                hi = _literal_for(p["max"], dtype)
                bad = bad | ((c > hi) if p["max_inclusive"] else (c >= hi))
            return bad
        if r.type == "in_set":
            dtype = self.spec.column(p["column"]).polars_dtype
            raw_values = references[p["reference"]] if "reference" in p else pl.Series(p["values"])
            values = raw_values.cast(dtype, strict=False).drop_nulls().unique()
            return c.is_not_null() & ~c.is_in(values.implode())
        if r.type == "regex":
            return c.is_not_null() & ~c.str.contains(p["pattern"])
        if r.type == "max_length":
            return c.str.len_chars() > p["max"]
        if r.type == "decimal":
            scaled = c.cast(pl.Float64) * (10 ** p["scale"])
            off_scale = (scaled - scaled.round(0)).abs() > 1e-6 * pl.max_horizontal(pl.lit(1.0), scaled.abs())
            too_wide = c.cast(pl.Float64).abs() >= 10 ** (p["precision"] - p["scale"])
            return off_scale | too_wide
        if r.type == "freshness":
            col_dtype = self.spec.column(p["column"]).dtype
            ts = c.cast(pl.Datetime("us", "UTC")) if col_dtype == "date" else c
            return (ref_time - ts) > pl.lit(p["max_age"])
        if r.type == "unique":
            cols = p["columns"]
            key = pl.col(cols[0]) if len(cols) == 1 else pl.struct(cols)
            return pl.all_horizontal([pl.col(x).is_not_null() for x in cols]) & ~key.is_first_distinct()
        if r.type == "condition":
            return self._conditions[r.id]
        raise AssertionError(f"unhandled rule type {r.type}")

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
        ``stages.active`` names the rules that have one.
        """
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
            lf = lf.with_columns(pl.struct(stages.unexpected).struct.json_encode().alias(_RAW + "_extra")).drop(
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
            masks.append(pl.lit(True).alias(_MASK + "schema_columns"))
            active.add("schema_columns")
        for c in spec.columns:
            if c.name in dtypes:
                dtype = dtypes[c.name]
                typed, bad = self._typed_column(c.name, dtype)
                if dtype != c.polars_dtype:
                    raw_keep.append(pl.col(c.name).alias(_RAW + c.name))
                typed_exprs.append(typed.alias(c.name))
                if bad is not None:
                    masks.append(bad.alias(_MASK + f"schema_type_{c.name}".lower()))
                    active.add(f"schema_type_{c.name}".lower())
            else:
                typed_exprs.append(pl.lit(None, dtype=c.polars_dtype).alias(c.name))
        rule_masks = []
        for rule in self.rules:
            if rule.spec is None:
                if rule.id.startswith("schema_not_null_"):
                    rule_masks.append(pl.col(rule.columns[0]).is_null().alias(_MASK + rule.id))
                    active.add(rule.id)
                continue
            ref = self._freshness_reference(rule, partition) if rule.type == "freshness" else pl.lit(None)
            rule_masks.append(self._rule_violation(rule, ref, references).fill_null(False).alias(_MASK + rule.id))
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
        partition: PartitionWindow | None = None,
        *,
        dry_run: bool | None = None,
        references: Mapping[str, pl.Series] | None = None,
    ) -> ValidationResult:
        """Split ``df`` into valid / quarantine / rejected. ``references`` maps ``<dataset>.<column>`` to its values."""
        spec = self.spec
        dry = spec.dry_run if dry_run is None else dry_run
        lf, stages = self.plan(df, partition, references)
        missing, unexpected = list(stages.missing), list(stages.unexpected)
        active = [r for r in self.rules if r.id in stages.active]

        def any_of(action: str) -> pl.Expr:
            cols = [pl.col(_MASK + r.id) for r in active if r.action == action]
            return pl.any_horizontal(cols) if cols else pl.lit(False)

        critical = [pl.col(_MASK + r.id) for r in active if r.severity == "critical"]
        lf = lf.with_columns(
            any_of("quarantine").alias("__q"),
            any_of("reject").alias("__r"),
            (pl.any_horizontal(critical) if critical else pl.lit(False)).alias("__crit"),
            any_of("flag").alias("__flag"),
        ).with_columns((pl.col("__r") & ~pl.col("__q")).alias("__r"))
        enrich_rules = [r for r in active if r.action == "enrich"]
        enrich_any = (
            pl.any_horizontal([pl.col(_MASK + r.id) for r in enrich_rules]) if enrich_rules else pl.lit(False)
        )
        lf = lf.with_columns((enrich_any & ~pl.col("__q") & ~pl.col("__r")).alias("__e"))
        frame = lf.collect()

        counts = {r.id: 0 for r in self.rules} | frame.select(
            [pl.col(_MASK + r.id).sum().alias(r.id) for r in active]
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
            )
            for r in self.rules
        ]
        partition_key = partition.key if partition else None
        contract_cols = list(spec.column_names)
        if dry:
            valid = frame.select(contract_cols + [SOURCE_ROW]).with_columns(pl.lit(False).alias(ENRICHED))
            quarantine = self._empty_quarantine()
            rejected = pl.DataFrame(schema=REJECTED_SCHEMA)
        else:
            keep = ~pl.col("__q") & ~pl.col("__r")
            # Project before filtering: the mask columns are not copied into the outputs.
            valid_cols = contract_cols + [SOURCE_ROW, "__e"] + [_MASK + r.id for r in enrich_rules]
            valid_frame = frame.lazy().filter(keep).select(valid_cols).collect()
            valid = self._apply_enrichment(valid_frame, enrich_rules).select(
                contract_cols + [SOURCE_ROW, pl.col("__e").alias(ENRICHED)]
            )
            quarantine = self._quarantine_rows(frame.filter(pl.col("__q")), partition_key, bool(unexpected), active)
            rejected = self._rejected_rows(frame.filter(pl.col("__r")), partition_key, active)
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
            missing_columns=missing,
            unexpected_columns=unexpected,
            rules=outcomes,
            planned=planned,
        )
        return ValidationResult(valid=valid, quarantine=quarantine, rejected=rejected, report=report)

    def _first_failing(self, rules: list[CompiledRule], attr: str) -> pl.Expr:
        return pl.coalesce(
            [pl.when(pl.col(_MASK + r.id)).then(pl.lit(getattr(r, attr))) for r in rules] + [pl.lit(None, pl.String)]
        )

    def _failed_list(self, active: list[CompiledRule]) -> pl.Expr:
        return pl.concat_str(
            [pl.when(pl.col(_MASK + r.id)).then(pl.lit(r.id)) for r in active], separator=",", ignore_nulls=True
        )

    def _quarantine_rows(
        self, rows: pl.DataFrame, partition_key: str | None, has_extra: bool, active: list[CompiledRule]
    ) -> pl.DataFrame:
        if rows.height == 0:
            return self._empty_quarantine()
        q_rules = [r for r in active if r.action == "quarantine"]
        values = []
        for c in self.spec.column_names:
            src = _RAW + c if (_RAW + c) in rows.columns else c
            values.append(_to_text(pl.col(src), rows.schema[src]).alias(c))
        meta = [
            pl.lit(self.spec.name).alias("_contract"),
            pl.lit(self.spec.version, pl.Int64).alias("_contract_version"),
            pl.lit(self.spec.content_hash).alias("_contract_hash"),
            self._first_failing(q_rules, "id").alias("_rule_id"),
            self._failed_list(active).alias("_failed_rules"),
            self._first_failing(q_rules, "severity").alias("_severity"),
            self._first_failing(q_rules, "reason").alias("_reason"),
            pl.lit(partition_key, pl.String).alias("_partition"),
            pl.col(SOURCE_ROW),
            (pl.col(_RAW + "_extra") if has_extra else pl.lit(None, pl.String)).alias("_extra_columns"),
            pl.lit("pending").alias("_replay_status"),
            pl.lit(datetime.now(UTC)).cast(pl.Datetime("us", "UTC")).alias("_quarantined_at"),
        ]
        return rows.select(values + meta)

    def _empty_quarantine(self) -> pl.DataFrame:
        schema = {c: pl.String() for c in self.spec.column_names} | QUARANTINE_META_SCHEMA
        return pl.DataFrame(schema=schema)

    def _rejected_rows(
        self, rows: pl.DataFrame, partition_key: str | None, active: list[CompiledRule]
    ) -> pl.DataFrame:
        if rows.height == 0:
            return pl.DataFrame(schema=REJECTED_SCHEMA)
        r_rules = [r for r in active if r.action == "reject"]
        return rows.select(
            pl.col(SOURCE_ROW),
            self._first_failing(r_rules, "id").alias("_rule_id"),
            self._failed_list(active).alias("_failed_rules"),
            self._first_failing(r_rules, "reason").alias("_reason"),
            pl.lit(partition_key, pl.String).alias("_partition"),
        )

    def _apply_enrichment(self, frame: pl.DataFrame, enrich_rules: list[CompiledRule]) -> pl.DataFrame:
        for rule in enrich_rules:
            assert rule.spec is not None and rule.spec.enrich is not None
            e = rule.spec.enrich
            mask = frame[_MASK + rule.id]
            if not mask.any():
                continue
            target = self.spec.column(e.column).polars_dtype
            if e.md5_of:
                idx = mask.arg_true()
                keys = frame[idx].select(
                    pl.concat_str([pl.col(c).cast(pl.String).fill_null("") for c in e.md5_of], separator="|").alias(
                        "k"
                    )
                )["k"]
                filled = [e.prefix + hashlib.md5(k.encode("utf-8")).hexdigest() for k in keys]  # noqa: S324 - an id, not security
                new = frame[e.column].cast(pl.String).scatter(idx, filled)
                frame = frame.with_columns(new.alias(e.column))
            else:
                frame = frame.with_columns(
                    pl.when(pl.col(_MASK + rule.id))
                    .then(pl.lit(e.value).cast(target))
                    .otherwise(pl.col(e.column))
                    .alias(e.column)
                )
        return frame

    # -- the single-record path
    def validate_record(
        self,
        record: dict[str, Any],
        partition: PartitionWindow | None = None,
        references: Mapping[str, pl.Series] | None = None,
    ) -> RecordVerdict:
        """Validate one record with the batch semantics (see keel.contracts.record); ``unique`` cannot fail here."""
        if self._record_validator is None:
            from keel.contracts.record import RecordValidator

            self._record_validator = RecordValidator(self)
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


def _cast_expr(src: pl.Expr, src_dtype: pl.DataType, target: str, fmt: str | None) -> pl.Expr:
    """Parse/cast ``src`` to the contract type; values that do not fit become null (never an exception)."""
    from keel.contracts.spec import DTYPES

    tdtype = DTYPES[target]
    if src_dtype == tdtype:
        return src
    is_text = src_dtype in (pl.String, pl.Categorical) or isinstance(src_dtype, pl.Enum)
    if is_text:
        text = src.cast(pl.String).str.strip_chars()
        if target == "bool":
            lowered = text.str.to_lowercase()
            return (
                pl.when(lowered.is_in(["true", "t", "yes", "1"]))
                .then(True)
                .when(lowered.is_in(["false", "f", "no", "0"]))
                .then(False)
                .otherwise(None)
            )
        if target == "datetime":
            if fmt and "%z" in fmt:
                return text.str.strptime(pl.Datetime("us"), fmt, strict=False).dt.convert_time_zone("UTC")
            if fmt:
                return text.str.strptime(pl.Datetime("us"), fmt, strict=False).dt.replace_time_zone("UTC")
            return text.str.strptime(pl.Datetime("us"), "%Y-%m-%dT%H:%M:%S", strict=False).dt.replace_time_zone("UTC")
        if target == "date":
            return text.str.strptime(pl.Date, fmt or "%Y-%m-%d", strict=False)
        if target == "string":
            return src.cast(pl.String)
        return text.cast(tdtype, strict=False)
    if target == "string":
        return src.cast(pl.String, strict=False)
    if target in ("date", "datetime") and not src_dtype.is_temporal():
        # A bare number is not a timestamp: epoch units are ambiguous and out-of-range values cannot be represented.
        return pl.lit(None, dtype=tdtype)
    if target.startswith("int") and src_dtype.is_float():
        # 1.5 must not silently become 1: only whole, finite numbers are valid integers.
        return pl.when(src.is_finite() & (src == src.round(0))).then(src).otherwise(None).cast(tdtype, strict=False)
    if target == "datetime" and isinstance(src_dtype, pl.Datetime):
        aware = src.dt.replace_time_zone("UTC") if src_dtype.time_zone is None else src.dt.convert_time_zone("UTC")
        return aware.cast(pl.Datetime("us", "UTC"))
    if target == "bool" and src_dtype.is_numeric():
        return pl.when(src == 1).then(True).when(src == 0).then(False).otherwise(None)
    return src.cast(tdtype, strict=False)


def _to_text(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    if dtype == pl.String:
        return expr
    if dtype.is_nested():
        return pl.struct(expr.alias("v")).struct.json_encode()
    return expr.cast(pl.String, strict=False)


def _literal_value(value: Any, dtype: str) -> Any:
    """A range bound as the Python value it means for a column of ``dtype``."""
    from datetime import date

    if dtype == "datetime" and isinstance(value, str):
        dt = datetime.fromisoformat(value)
        return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    if dtype == "date" and isinstance(value, str):
        return date.fromisoformat(value)
    return value


def _literal_for(value: Any, dtype: str) -> pl.Expr:
    lit = _literal_value(value, dtype)
    if dtype == "datetime":
        return pl.lit(lit).cast(pl.Datetime("us", "UTC"))
    return pl.lit(lit)


def _default_reason(r: RuleSpec) -> str:
    p = r.params
    if r.type == "not_null":
        return f"{p['column']} is null"
    if r.type == "parseable":
        return f"{p['column']} does not parse as {p['as']}"
    if r.type == "range":
        lo = ("[" if p["min_inclusive"] else "(") + ("-inf" if p["min"] is None else str(p["min"]))
        hi = ("inf" if p["max"] is None else str(p["max"])) + ("]" if p["max_inclusive"] else ")")
        return f"{p['column']} outside {lo}, {hi}"
    if r.type == "in_set":
        return (
            f"{p['column']} not in {p['reference']}" if "reference" in p else f"{p['column']} not in the allowed set"
        )
    if r.type == "regex":
        return f"{p['column']} does not match {p['pattern']}"
    if r.type == "max_length":
        return f"{p['column']} longer than {p['max']} characters"
    if r.type == "decimal":
        return f"{p['column']} does not fit decimal({p['precision']},{p['scale']})"
    if r.type == "freshness":
        return f"{p['column']} older than {p['max_age_text']} before the {p['relative_to'].replace('_', ' ')}"
    if r.type == "unique":
        return f"duplicate key ({', '.join(p['columns'])})"
    if r.type == "condition":
        return f"condition violated: {p['expr']}"
    return r.type
