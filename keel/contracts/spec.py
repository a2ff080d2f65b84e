"""Data contracts as YAML: the schema, the rules, and what happens to a row that breaks one.

A contract is parsed and checked completely before any data is read (``keel contracts lint``): unknown rule types,
invalid regexes, wrong field types and conditions that do not parse are reported with the file, line and field.
The file format is documented in docs/contracts.md.
"""

from __future__ import annotations

import re
from pathlib import Path as FsPath
from typing import Any

from keel.contracts.model import (  # noqa: F401 - the contract model, read here, used by callers of spec
    ACTIONS,
    DERIVED,
    DTYPES,
    NUMERIC,
    RULE_ID,
    SEVERITIES,
    ColumnSpec,
    ContractSpec,
    Enrichment,
    RuleSpec,
    kind,
    parse_duration,
    regex_error,
    type_names,
)
from keel.contracts.rules import RULE_TYPES, RULES  # noqa: F401
from keel.contracts.yamlpos import Path, PositionedYaml, load_positioned
from keel.errors import ContractError, InvalidNameError
from keel.names import validate_name


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
            raise self.fail(path, f"expected a mapping, got {kind(value)}")
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
            raise self.fail(path + (key,), f"expected {type_names(types)}, got a boolean")
        if not isinstance(value, types):
            raise self.fail(path + (key,), f"expected {type_names(types)}, got {kind(value)}")
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
        self.no_unknown(budget, {"max_fraction", "allowed_rows"}, ("critical_budget",))
        max_fraction = float(self.get(budget, "max_fraction", ("critical_budget",), (int, float), default=0.0))
        if not 0.0 <= max_fraction <= 1.0:
            raise self.fail(("critical_budget", "max_fraction"), "must be between 0 and 1")
        allowed_rows = self.get(budget, "allowed_rows", ("critical_budget",), (int,), default=0)
        if allowed_rows < 0:
            raise self.fail(("critical_budget", "allowed_rows"), "must be a whole number of rows, 0 or more")

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
            critical_budget_rows=allowed_rows,
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
            self.no_unknown(spec, {"type", "nullable", "format", "allow_non_finite", "description", "derived"}, path)
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
                    derived=self.choice(spec, "derived", path, DERIVED, "") or None,
                )
            )
        if not out:
            raise self.fail(("schema", "columns"), "a contract needs at least one column")
        return out

    def read_rule(self, item: Any, path: Path, columns: list[ColumnSpec]) -> RuleSpec:
        m = self.mapping(item, path)
        rule_id = self.get(m, "id", path, (str,), required=True)
        if not RULE_ID.match(rule_id):
            raise self.fail(path + ("id",), f"invalid rule id '{rule_id}': use lowercase letters, digits and '_'")
        rtype = self.get(m, "type", path, (str,), required=True)
        if rtype not in RULES:
            raise self.fail(path + ("type",), f"unknown rule type '{rtype}' (known: {', '.join(RULES)})")
        kind = RULES[rtype]
        severity = self.choice(m, "severity", path, SEVERITIES, "critical")
        default_action = "quarantine" if severity == "critical" else "flag"
        action = self.choice(m, "action", path, ACTIONS, default_action)
        common = {"id", "type", "severity", "action", "description", "enrich", "max_failure_fraction"}
        self.no_unknown(m, common | kind.keys, path)
        params: dict[str, Any] = {}
        if "column" in kind.keys:
            params["column"] = self.get(m, "column", path, (str,), required=True)
        params |= kind.read(self, m, path, columns)
        colspecs = {c.name: c for c in columns}
        col = params.get("column")
        if col is not None and col in colspecs:
            kind.check_column(self, path, params, colspecs[col])

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
