"""A malformed contract gives one clear error naming the file, the line and the field."""

from __future__ import annotations

import textwrap

import pytest

from keel.contracts.spec import load_contract, parse_contract
from keel.errors import ContractError
from tests import CONTRACTS

BASE = """\
contract: demo
version: 1
schema:
  columns:
    a: {type: int64}
    s: {type: string}
rules:
"""


def err(rules: str) -> ContractError:
    with pytest.raises(ContractError) as info:
        parse_contract(BASE + textwrap.indent(textwrap.dedent(rules), "  "), source="demo.yaml")
    return info.value


def test_reference_contracts_lint_clean():
    for path in CONTRACTS.glob("*.yaml"):
        spec = load_contract(path)
        assert spec.rules and spec.columns
        assert len(spec.content_hash) == 64


def test_unknown_rule_type_names_line_and_field():
    e = err("- id: r1\n  type: not_nul\n  column: a\n")
    assert e.source == "demo.yaml" and e.line == 9 and e.field == "rules[0].type"
    assert "unknown rule type 'not_nul'" in str(e) and "not_null" in str(e)


def test_invalid_regex_is_reported_by_the_linear_engine():
    e = err("- id: r1\n  type: regex\n  column: s\n  pattern: '(abc'\n")
    assert e.line == 11 and e.field == "rules[0].pattern"
    assert "unclosed group" in str(e)


def test_backreferences_are_refused_not_run_by_a_backtracking_engine():
    e = err("- id: r1\n  type: regex\n  column: s\n  pattern: '(a)\\1'\n")
    assert e.field == "rules[0].pattern"


def test_wrong_field_type():
    e = err("- id: r1\n  type: range\n  column: a\n  min: ten\n  max: 3\n")
    assert e.field == "rules[0].min" and e.line == 11 and "must be a number for int64 column 'a'" in str(e)
    e = err("- id: r1\n  type: range\n  column: a\n  min: [1]\n")
    assert (
        e.field == "rules[0].min"
        and e.line == 11
        and "expected an integer or a number or a string, got a list" in str(e)
    )


@pytest.mark.parametrize(
    ("budget", "field", "message"),
    [("{max_fraction: 0.02, allowed_rows: -1}", "critical_budget.allowed_rows", "0 or more"),
     ("{max_fraction: 0.02, allowed_rows: 1.5}", "critical_budget.allowed_rows", "expected an integer"),
     ("{max_fraction: 0.02, allowed_rows: true}", "critical_budget.allowed_rows", "got a boolean"),
     ("{max_fraction: 0.02, rows: 1}", "critical_budget.rows", "allowed_rows")],
)  # fmt: skip
def test_a_bad_budget_of_rows_is_named(budget, field, message):
    with pytest.raises(ContractError) as info:
        parse_contract(BASE.replace("schema:", f"critical_budget: {budget}\nschema:"), source="demo.yaml")
    assert info.value.field == field and message in str(info.value)


def test_boolean_is_not_a_number():
    e = err("- id: r1\n  type: max_length\n  column: s\n  max: true\n")
    assert e.field == "rules[0].max" and "got a boolean" in str(e)


def test_yaml_syntax_error_names_line():
    with pytest.raises(ContractError) as info:
        parse_contract("contract: x\nversion: 1\nschema: {columns: [a\n", source="broken.yaml")
    assert (
        info.value.source == "broken.yaml" and info.value.line is not None and "YAML syntax error" in str(info.value)
    )


def test_unknown_field_and_unknown_column():
    e = err("- id: r1\n  type: not_null\n  column: a\n  colour: red\n")
    assert e.field == "rules[0].colour" and "unknown field" in str(e)
    e = err("- id: r1\n  type: not_null\n  column: nope\n")
    assert "column 'nope'" in str(e) and e.line == 8


def test_condition_that_does_not_parse():
    e = err("- id: r1\n  type: condition\n  expr: a >>= 1\n")
    assert e.field == "rules[0].expr" and "cannot parse condition" in str(e)
    e = err("- id: r1\n  type: condition\n  expr: __import__('os').system('true')\n")
    assert e.field == "rules[0].expr"


def test_duplicate_rule_ids_and_bad_names():
    e = err("- id: r1\n  type: not_null\n  column: a\n- id: r1\n  type: not_null\n  column: s\n")
    assert "duplicate rule id" in str(e) and e.field == "rules[1].id"
    with pytest.raises(ContractError, match="contract name"):
        parse_contract("contract: ../etc\nversion: 1\nschema: {columns: {a: int64}}\n")


def test_enrich_needs_a_value():
    e = err("- id: r1\n  type: not_null\n  column: s\n  action: enrich\n")
    assert "missing required field 'enrich'" in str(e)
    e = err("- id: r1\n  type: not_null\n  column: s\n  action: enrich\n  enrich: {column: s}\n")
    assert "needs 'value' or 'md5_of'" in str(e)


def test_missing_file_and_non_utf8_file(tmp_path):
    with pytest.raises(ContractError, match="cannot read contract"):
        load_contract(tmp_path / "absent.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"contract: caf\xe9\n")
    with pytest.raises(ContractError, match="not valid UTF-8"):
        load_contract(bad)


def test_content_hash_changes_with_any_edit():
    a = parse_contract(BASE + "  - {id: r1, type: not_null, column: a}\n")
    b = parse_contract(BASE + "  - {id: r1, type: not_null, column: s}\n")
    assert a.content_hash != b.content_hash
