"""Data contracts as YAML: the schema, the rules, and what happens to a row that breaks one.

A contract is parsed and checked completely before any data is read (``keel contracts lint``): unknown rule types,
invalid regexes, wrong field types and conditions that do not parse are reported with the file, line and field.
The file format is documented in docs/contracts.md.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path as FsPath
from typing import Any

import polars as pl

from keel.contracts.dsl import DslError, parse_condition
from keel.contracts.yamlpos import Path, PositionedYaml, load_positioned
from keel.errors import ContractError, InvalidNameError
from keel.names import validate_name

DTYPES: dict[str, pl.DataType] = {
    "int8": pl.Int8(),
    "int16": pl.Int16(),
    "int32": pl.Int32(),
    "int64": pl.Int64(),
    "float32": pl.Float32(),
    "float64": pl.Float64(),
    "string": pl.String(),
    "bool": pl.Boolean(),
    "date": pl.Date(),
    "datetime": pl.Datetime("us", "UTC"),
}
NUMERIC = {"int8", "int16", "int32", "int64", "float32", "float64"}

SEVERITIES = ("critical", "warning", "info")
ACTIONS = ("quarantine", "reject", "enrich", "flag")
RULE_TYPES = (
    "not_null",
    "parseable",
    "range",
    "in_set",
    "regex",
    "max_length",
    "decimal",
    "freshness",
    "unique",
    "condition",
)
# keel-owned fixed patterns over contract text (not user patterns over data).
_RULE_ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DURATION = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    dtype: str
    nullable: bool = True
    format: str | None = None  # strptime format for date/datetime parsed from text
    allow_non_finite: bool = False  # NaN/inf in a float column are type violations unless allowed
    description: str = ""

    @property
    def polars_dtype(self) -> pl.DataType:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class Enrichment:
    """What an ``enrich`` rule writes into a failing row: a constant, or ``prefix + md5(columns)``."""

    column: str
    value: Any = None
    prefix: str = ""
    md5_of: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuleSpec:
    id: str
    type: str
    severity: str
    action: str
    params: dict[str, Any]
    description: str = ""
    enrich: Enrichment | None = None
    # The per-rule check fails when more than this fraction of rows violate the rule.
    max_failure_fraction: float = 0.0
    line: int | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        if "columns" in self.params:
            return tuple(self.params["columns"])
        if "column" in self.params:
            return (self.params["column"],)
        return tuple(sorted(self.params.get("_condition_columns", ())))


@dataclass(frozen=True)
class ContractSpec:
    name: str
    version: int
    description: str
    owner: str
    columns: tuple[ColumnSpec, ...]
    rules: tuple[RuleSpec, ...]
    schema_severity: str = "critical"
    schema_action: str = "quarantine"
    unexpected_columns: str = "drop"  # drop | quarantine
    critical_budget_fraction: float = 0.0
    dry_run: bool = False
    source: str = "<string>"
    text: str = field(default="", repr=False)

    @property
    def content_hash(self) -> str:
        """sha256 of the contract file's bytes: the assets' code_version, so an edit marks downstream stale."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def references(self) -> tuple[str, ...]:
        """``<dataset>.<column>`` value sets that in_set rules read from other datasets."""
        return tuple(sorted({r.params["reference"] for r in self.rules if "reference" in r.params}))

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


def parse_duration(text: Any) -> timedelta:
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        raise ValueError(f"expected a duration such as '36h' or '32d', got {text!r}")
    m = _DURATION.match(text.strip())
    assert m is not None
    return timedelta(**{_DURATION_UNITS[m.group(2)]: int(m.group(1))})


def load_contract(path: str | FsPath) -> ContractSpec:
    """Read and check a contract file. Raises ``ContractError`` naming file, line and field."""
    p = FsPath(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ContractError(f"cannot read contract: {exc.strerror}", source=str(p)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"contract is not valid UTF-8 (byte {exc.start})", source=str(p)) from None
    return parse_contract(text, source=str(p))


def parse_contract(text: str, source: str = "<string>") -> ContractSpec:
    doc = load_positioned(text, source)
    return _ContractReader(doc, text).read()


class _ContractReader:
    def __init__(self, doc: PositionedYaml, text: str):
        self.doc = doc
        self.text = text

    # -- typed field access with positioned errors
    def fail(self, path: Path, message: str) -> ContractError:
        return self.doc.error(path, message)

    def mapping(self, value: Any, path: Path) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {_kind(value)}")
        return value

    def get(
        self,
        m: dict[str, Any],
        key: str,
        path: Path,
        types: tuple[type, ...],
        *,
        required: bool = False,
        default: Any = None,
    ) -> Any:
        if key not in m:
            if required:
                raise self.fail(path, f"missing required field '{key}'")
            return default
        value = m[key]
        # bool is an int in Python; never accept true/false where a number is asked for.
        if isinstance(value, bool) and bool not in types:
            raise self.fail(path + (key,), f"expected {_names(types)}, got a boolean")
        if not isinstance(value, types):
            raise self.fail(path + (key,), f"expected {_names(types)}, got {_kind(value)}")
        return value

    def no_unknown(self, m: dict[str, Any], allowed: set[str], path: Path) -> None:
        for key in m:
            if key not in allowed:
                raise self.fail(path + (key,), f"unknown field '{key}' (allowed: {', '.join(sorted(allowed))})")

    # -- the document
    def read(self) -> ContractSpec:
        top = self.mapping(self.doc.data, ())
        self.no_unknown(
            top, {"contract", "version", "description", "owner", "schema", "rules", "critical_budget", "dry_run"}, ()
        )
        name = self.get(top, "contract", (), (str,), required=True)
        try:
            validate_name(name, what="contract name")
        except InvalidNameError as exc:
            raise self.fail(("contract",), str(exc)) from None
        version = self.get(top, "version", (), (int,), required=True)
        if version < 1:
            raise self.fail(("version",), "version must be a positive integer")
        description = self.get(top, "description", (), (str,), default="")
        owner = self.get(top, "owner", (), (str,), default="")
        dry_run = self.get(top, "dry_run", (), (bool,), default=False)
        budget = self.mapping(
            self.get(top, "critical_budget", (), (dict,), default={"max_fraction": 0.0}), ("critical_budget",)
        )
        self.no_unknown(budget, {"max_fraction"}, ("critical_budget",))
        max_fraction = float(self.get(budget, "max_fraction", ("critical_budget",), (int, float), default=0.0))
        if not 0.0 <= max_fraction <= 1.0:
            raise self.fail(("critical_budget", "max_fraction"), "must be between 0 and 1")

        schema = self.mapping(self.get(top, "schema", (), (dict,), required=True), ("schema",))
        self.no_unknown(schema, {"columns", "on_violation", "unexpected_columns"}, ("schema",))
        on_violation = self.mapping(
            self.get(schema, "on_violation", ("schema",), (dict,), default={}), ("schema", "on_violation")
        )
        self.no_unknown(on_violation, {"severity", "action"}, ("schema", "on_violation"))
        schema_severity = self.choice(on_violation, "severity", ("schema", "on_violation"), SEVERITIES, "critical")
        schema_action = self.choice(
            on_violation, "action", ("schema", "on_violation"), ("quarantine", "reject"), "quarantine"
        )
        unexpected = self.choice(schema, "unexpected_columns", ("schema",), ("drop", "quarantine"), "drop")
        columns = self.read_columns(self.get(schema, "columns", ("schema",), (dict,), required=True))

        rules_raw = self.get(top, "rules", (), (list,), default=[])
        rules = []
        seen: set[str] = set()
        colnames = {c.name for c in columns}
        for i, item in enumerate(rules_raw):
            rule = self.read_rule(item, ("rules", i), columns)
            if rule.id in seen:
                raise self.fail(("rules", i, "id"), f"duplicate rule id '{rule.id}'")
            seen.add(rule.id)
            for col in rule.columns:
                if col not in colnames:
                    raise self.fail(
                        ("rules", i), f"rule '{rule.id}' reads column '{col}', which is not in the schema"
                    )
            rules.append(rule)
        return ContractSpec(
            name=name,
            version=version,
            description=description,
            owner=owner,
            columns=tuple(columns),
            rules=tuple(rules),
            schema_severity=schema_severity,
            schema_action=schema_action,
            unexpected_columns=unexpected,
            critical_budget_fraction=max_fraction,
            dry_run=dry_run,
            source=self.doc.source,
            text=self.text,
        )

    def choice(self, m: dict[str, Any], key: str, path: Path, options: tuple[str, ...], default: str) -> str:
        value = self.get(m, key, path, (str,), default=default)
        if value not in options:
            raise self.fail(path + (key,), f"'{value}' is not one of: {', '.join(options)}")
        return value

    def read_columns(self, raw: dict[str, Any]) -> list[ColumnSpec]:
        out = []
        for name, spec in raw.items():
            path: Path = ("schema", "columns", name)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
                raise self.fail(path, f"invalid column name '{name}'")
            if isinstance(spec, str):
                spec = {"type": spec}
            spec = self.mapping(spec, path)
            self.no_unknown(spec, {"type", "nullable", "format", "allow_non_finite", "description"}, path)
            dtype = self.choice(spec, "type", path, tuple(DTYPES), "string")
            if "type" not in spec:
                raise self.fail(path, "missing required field 'type'")
            fmt = self.get(spec, "format", path, (str,))
            if fmt is not None and dtype not in ("date", "datetime"):
                raise self.fail(path + ("format",), "'format' applies only to date and datetime columns")
            out.append(
                ColumnSpec(
                    name=name,
                    dtype=dtype,
                    nullable=self.get(spec, "nullable", path, (bool,), default=True),
                    format=fmt,
                    allow_non_finite=self.get(spec, "allow_non_finite", path, (bool,), default=False),
                    description=self.get(spec, "description", path, (str,), default=""),
                )
            )
        if not out:
            raise self.fail(("schema", "columns"), "a contract needs at least one column")
        return out

    def read_rule(self, item: Any, path: Path, columns: list[ColumnSpec]) -> RuleSpec:
        m = self.mapping(item, path)
        rule_id = self.get(m, "id", path, (str,), required=True)
        if not _RULE_ID.match(rule_id):
            raise self.fail(path + ("id",), f"invalid rule id '{rule_id}': use lowercase letters, digits and '_'")
        rtype = self.get(m, "type", path, (str,), required=True)
        if rtype not in RULE_TYPES:
            raise self.fail(path + ("type",), f"unknown rule type '{rtype}' (known: {', '.join(RULE_TYPES)})")
        severity = self.choice(m, "severity", path, SEVERITIES, "critical")
        default_action = "quarantine" if severity == "critical" else "flag"
        action = self.choice(m, "action", path, ACTIONS, default_action)
        common = {"id", "type", "severity", "action", "description", "enrich", "max_failure_fraction"}
        specific = {
            "not_null": {"column"},
            "parseable": {"column", "as", "format"},
            "range": {"column", "min", "max", "min_inclusive", "max_inclusive"},
            "in_set": {"column", "values", "reference"},
            "regex": {"column", "pattern"},
            "max_length": {"column", "max"},
            "decimal": {"column", "precision", "scale"},
            "freshness": {"column", "max_age", "relative_to"},
            "unique": {"columns"},
            "condition": {"expr"},
        }[rtype]
        self.no_unknown(m, common | specific, path)
        params: dict[str, Any] = {}
        if "column" in specific:
            params["column"] = self.get(m, "column", path, (str,), required=True)
        colspecs = {c.name: c for c in columns}

        if rtype == "parseable":
            params["as"] = self.get(m, "as", path, (str,), required=True)
            if params["as"] not in DTYPES:
                raise self.fail(path + ("as",), f"'{params['as']}' is not one of: {', '.join(DTYPES)}")
            params["format"] = self.get(m, "format", path, (str,))
        elif rtype == "range":
            lo = self.get(m, "min", path, (int, float, str))
            hi = self.get(m, "max", path, (int, float, str))
            if lo is None and hi is None:
                raise self.fail(path, "a range rule needs 'min', 'max' or both")
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
                raise self.fail(path + ("min",), f"min ({lo}) is greater than max ({hi})")
            params.update(
                min=lo,
                max=hi,
                min_inclusive=self.get(m, "min_inclusive", path, (bool,), default=True),
                max_inclusive=self.get(m, "max_inclusive", path, (bool,), default=True),
            )
        elif rtype == "in_set":
            if ("values" in m) == ("reference" in m):
                raise self.fail(
                    path, "an in_set rule needs either 'values' (a list) or 'reference' (<dataset>.<column>)"
                )
            if "reference" in m:
                ref = self.get(m, "reference", path, (str,))
                dataset, _, column = ref.partition(".")
                try:
                    validate_name(dataset, what="reference dataset")
                except InvalidNameError as exc:
                    raise self.fail(path + ("reference",), str(exc)) from None
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", column):
                    raise self.fail(path + ("reference",), f"expected <dataset>.<column>, got {ref!r}")
                params["reference"] = ref
            else:
                values = self.get(m, "values", path, (list,))
                if not values:
                    raise self.fail(path + ("values",), "an in_set rule needs at least one value")
                for j, v in enumerate(values):
                    if not isinstance(v, (str, int, float, bool)):
                        raise self.fail(path + ("values", j), f"values must be scalars, got {_kind(v)}")
                params["values"] = list(values)
        elif rtype == "regex":
            pattern = self.get(m, "pattern", path, (str,), required=True)
            error = regex_error(pattern)
            if error:
                raise self.fail(path + ("pattern",), f"invalid regex {pattern!r}: {error}")
            params["pattern"] = pattern
        elif rtype == "max_length":
            params["max"] = self.get(m, "max", path, (int,), required=True)
            if params["max"] < 0:
                raise self.fail(path + ("max",), "must be >= 0")
        elif rtype == "decimal":
            params["precision"] = self.get(m, "precision", path, (int,), required=True)
            params["scale"] = self.get(m, "scale", path, (int,), required=True)
            if not 1 <= params["precision"] <= 38 or not 0 <= params["scale"] <= params["precision"]:
                raise self.fail(path + ("precision",), "need 1 <= precision <= 38 and 0 <= scale <= precision")
        elif rtype == "freshness":
            try:
                params["max_age_text"] = self.get(m, "max_age", path, (str,), required=True)
                params["max_age"] = parse_duration(params["max_age_text"])
            except ValueError as exc:
                raise self.fail(path + ("max_age",), str(exc)) from None
            params["relative_to"] = self.choice(m, "relative_to", path, ("partition_end", "now"), "partition_end")
        elif rtype == "unique":
            cols = self.get(m, "columns", path, (list, str), required=True)
            cols = [cols] if isinstance(cols, str) else cols
            if not cols or not all(isinstance(c, str) for c in cols):
                raise self.fail(path + ("columns",), "expected a column name or a list of column names")
            params["columns"] = list(cols)
        elif rtype == "condition":
            expr_text = self.get(m, "expr", path, (str,), required=True)
            try:
                parsed = parse_condition(expr_text)
            except DslError as exc:
                raise self.fail(path + ("expr",), f"cannot parse condition {expr_text!r}: {exc}") from None
            params["expr"] = expr_text
            params["_condition_columns"] = sorted(parsed.columns)
            unknown = sorted(parsed.columns - set(colspecs))
            if unknown:
                raise self.fail(
                    path + ("expr",), f"condition reads column '{unknown[0]}', which is not in the schema"
                )
            # Type-check against the schema now (e.g. a string compared with a number), not at run time.
            empty = pl.DataFrame(schema={c.name: c.polars_dtype for c in columns})
            try:
                empty.select(parsed.violation)
            except Exception as exc:  # polars raises several error types for ill-typed expressions
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise self.fail(path + ("expr",), f"condition {expr_text!r} does not type-check: {first}") from None

        col = params.get("column")
        if col is not None and col in colspecs:
            cspec = colspecs[col]
            if rtype in ("regex", "max_length") and cspec.dtype != "string":
                raise self.fail(path + ("column",), f"a {rtype} rule needs a string column; '{col}' is {cspec.dtype}")
            if rtype == "decimal" and cspec.dtype not in NUMERIC:
                raise self.fail(
                    path + ("column",), f"a decimal rule needs a numeric column; '{col}' is {cspec.dtype}"
                )
            if rtype == "freshness" and cspec.dtype not in ("date", "datetime"):
                raise self.fail(
                    path + ("column",), f"a freshness rule needs a date or datetime column; '{col}' is {cspec.dtype}"
                )
            if rtype == "range" and cspec.dtype in ("string", "bool"):
                raise self.fail(
                    path + ("column",), f"a range rule needs a numeric or temporal column; '{col}' is {cspec.dtype}"
                )
            if rtype == "range":
                for bound in ("min", "max"):
                    value = params[bound]
                    if value is None:
                        continue
                    if cspec.dtype in NUMERIC and not isinstance(value, (int, float)):
                        raise self.fail(
                            path + (bound,),
                            f"{bound} must be a number for {cspec.dtype} column '{col}', got {value!r}",
                        )
                    if cspec.dtype in ("date", "datetime") and not _is_iso(value, cspec.dtype):
                        raise self.fail(
                            path + (bound,),
                            f"{bound} must be an ISO {cspec.dtype} string for column '{col}', got {value!r}",
                        )

        enrich = None
        if action == "enrich":
            enrich = self.read_enrichment(m, path, colspecs)
        elif "enrich" in m:
            raise self.fail(path + ("enrich",), "'enrich' is only used with action: enrich")
        frac = float(self.get(m, "max_failure_fraction", path, (int, float), default=0.0))
        if not 0.0 <= frac <= 1.0:
            raise self.fail(path + ("max_failure_fraction",), "must be between 0 and 1")
        return RuleSpec(
            id=rule_id,
            type=rtype,
            severity=severity,
            action=action,
            params=params,
            description=self.get(m, "description", path, (str,), default=""),
            enrich=enrich,
            max_failure_fraction=frac,
            line=self.doc.line_of(path),
        )

    def read_enrichment(self, m: dict[str, Any], path: Path, colspecs: dict[str, ColumnSpec]) -> Enrichment:
        e = self.mapping(self.get(m, "enrich", path, (dict,), required=True), path + ("enrich",))
        epath = path + ("enrich",)
        self.no_unknown(e, {"column", "value", "prefix", "md5_of"}, epath)
        column = self.get(e, "column", epath, (str,), required=True)
        if column not in colspecs:
            raise self.fail(epath + ("column",), f"column '{column}' is not in the schema")
        md5_of = self.get(e, "md5_of", epath, (list, str), default=[])
        md5_of = [md5_of] if isinstance(md5_of, str) else md5_of
        for c in md5_of:
            if c not in colspecs:
                raise self.fail(epath + ("md5_of",), f"column '{c}' is not in the schema")
        if "value" in e and md5_of:
            raise self.fail(epath, "give either 'value' or 'md5_of' (with an optional 'prefix'), not both")
        if "value" not in e and not md5_of:
            raise self.fail(epath, "an enrichment needs 'value' or 'md5_of'")
        if md5_of and colspecs[column].dtype != "string":
            raise self.fail(epath + ("column",), "a derived md5 value can only fill a string column")
        return Enrichment(
            column=column,
            value=e.get("value"),
            prefix=self.get(e, "prefix", epath, (str,), default=""),
            md5_of=tuple(md5_of),
        )


def _is_iso(value: Any, dtype: str) -> bool:
    from datetime import date, datetime

    if not isinstance(value, str):
        return False
    try:
        (date.fromisoformat if dtype == "date" else datetime.fromisoformat)(value)
    except ValueError:
        return False
    return True


def regex_error(pattern: str) -> str | None:
    """Compile ``pattern`` with both linear-time engines keel runs it on: polars (batches) and flpc (single
    records), both the Rust ``regex`` crate. Python's ``re`` never sees a user pattern."""
    import flpc

    try:
        flpc.compile(pattern)
    except Exception as exc:  # flpc raises ValueError with the crate's message
        lines = [ln for ln in str(exc).splitlines() if ln.startswith("error:")]
        return (
            lines[0][len("error:") :].strip() if lines else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        )
    try:
        pl.Series("p", [""], dtype=pl.String).str.contains(pattern)
    except Exception as exc:  # polars raises ComputeError with the engine's message
        for line in str(exc).splitlines():
            if line.startswith("error:"):
                return line[len("error:") :].strip()
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


_TYPE_NAMES = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
}


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
