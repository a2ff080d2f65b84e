"""User regexes run on polars' Rust engine, which is linear-time: catastrophic backtracking cannot happen.

No wall-clock assertion here (speed is measured in bench/): the timeout marker only turns a hang — what Python's
backtracking ``re`` would do with ``^(a+)+$`` on these inputs — into a failure instead of a stuck suite.
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import make_contract


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pattern", [r"^(a+)+$", r"^(a|a)*$", r"^(a|aa)+$", r"(x+x+)+y"])
def test_catastrophic_patterns_on_50kb_inputs_finish(pattern):
    c = make_contract("s: {type: string}", f"- {{id: evil, type: regex, column: s, pattern: '{pattern}'}}")
    near_miss = "a" * 50_000 + "!"  # the classic worst case for backtracking engines
    xs = "x" * 50_000
    df = pl.DataFrame({"s": [near_miss] * 20 + ["a" * 50_000, xs]})
    result = c.validate(df)
    assert result.report.rows_in == 22 and result.report.conserved
    if pattern.startswith("^(a"):
        assert result.report.rule("evil").failed == 21  # every near miss and the x row fail; the all-'a' row matches


def test_python_re_is_never_imported_for_user_patterns():
    """The contract modules that touch user patterns do not import Python's re."""
    import ast
    from pathlib import Path

    import keel.contracts.engine as engine

    tree = ast.parse(Path(engine.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "re" not in imported and "regex" not in imported


PATTERNS = [
    r"^[A-Z0-9]{2}$",
    r"^N[0-9A-Z]{1,5}$",
    r"\d+",
    r"^\w+$",
    r"é|ß",
    r"(?i)^ab",
    r"^$",
    r"[[:alpha:]]{3}",
    r"\bA",
]


def test_record_and_batch_regex_engines_agree():
    """flpc (records) and polars (batches) are both the Rust regex crate: same answers, Unicode classes included."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from keel.contracts.values import regex_matches

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(PATTERNS), st.text(max_size=12))
    def check(pattern, text):
        batch = pl.Series([text], dtype=pl.String).str.contains(pattern).item()
        assert regex_matches(pattern, text) == batch

    check()
