"""The condition language: SQL CHECK semantics, arithmetic, and no way to run code."""

from __future__ import annotations

import polars as pl
import pytest

from keel.contracts.dsl import DslError, parse_condition

FRAME = pl.DataFrame({"a": [1, None, 3, None, 5], "b": [1, 2, None, None, 5], "s": ["x", "y", None, "z", "x"]})


def violations(text: str) -> list[bool]:
    return FRAME.select(parse_condition(text).violation.alias("v"))["v"].to_list()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a is not null when b is not null", [False, True, False, False, False]),
        ("a is null", [True, False, True, False, True]),
        ("a + b * 2 >= 3", [False, False, False, False, False]),
        ("a + b * 2 >= 10", [True, False, False, False, False]),
        ("a - -1 == 2", [False, False, True, False, True]),
        ("s in ('x', 'z')", [False, True, False, False, False]),
        ("s not in ('x')", [True, False, False, False, True]),
        ("not (a > 1) or b == 2", [False, False, False, False, True]),
        ("a > 2 and s == 'x'", [True, True, False, True, False]),  # null and false is false
        ("(a > 2 or b > 2) when s is not null", [True, False, False, False, False]),
        ("A <> 1 WHEN B IS NOT NULL".replace("A", "a").replace("B", "b"), [True, False, False, False, False]),
    ],
)
def test_semantics(text, expected):
    assert violations(text) == expected


def test_columns_are_reported():
    assert parse_condition("arr_time is not null when dep_time is not null").columns == {"arr_time", "dep_time"}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a >",
        "a is null when",
        "import os",
        "__import__('os').system('id')",
        "a == 'x",
        "a ; b",
        "a in (b)",
        "lambda: 1",
        "a.b == 1",
        "a[0] == 1",
        "(a == 1",
        "a == 1)",
    ],
)
def test_malformed_or_hostile_text_is_a_parse_error(text):
    with pytest.raises(DslError):
        parse_condition(text)
