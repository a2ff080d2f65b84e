"""The platform names no use case: identifiers and string literals (not comments or docstrings) of keel/ and
gpu_runtime/ modules must not name the flights use case.

Issue 30 moves flights out of the core module by module; ``CLEAN`` lists what has moved, and the test holds each
of them (and every new module under them) to the rule. When the last module is clean, ``CLEAN`` becomes the whole of
keel/ and gpu_runtime/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The flights use case's own words: its entity, columns, data package, model and asset names.
FLIGHTS_WORDS = re.compile(
    r"flight|carrier|tailnum|arr_delay|dep_delay|nycflights|delay_model|sched_date|plane_age|late15",
    re.IGNORECASE,
)
CLEAN = [
    "keel/features",
    "keel/usecase.py",
    "keel/streaming/features_sql.py",
    "gpu_runtime/gateway/explain.py",
    "gpu_runtime/gateway/health.py",
]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def names_of_flights(source: str, filename: str = "<string>") -> list[str]:
    """``line: word`` for every identifier, attribute, argument or string literal (docstrings excepted) that names
    the flights use case."""
    tree = ast.parse(source, filename=filename)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.arg):
            text = node.arg
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            text = node.name
        elif isinstance(node, ast.alias):
            text = node.asname or node.name
        elif isinstance(node, ast.keyword) and node.arg:
            text = node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        if text and FLIGHTS_WORDS.search(text):
            found.append(f"{node.lineno}: {text[:60]!r}")
    return found


def modules(entry: str) -> list[Path]:
    path = REPO / entry
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize("entry", CLEAN)
def test_platform_modules_name_no_use_case(entry):
    problems = {
        str(p.relative_to(REPO)): hits for p in modules(entry) if (hits := names_of_flights(p.read_text(), str(p)))
    }
    assert problems == {}


def test_the_reader_finds_names_and_literals_but_not_comments_or_docstrings():
    sample = '''
"""A module about flights."""
# flights in a comment
def score(rows):
    """Scores flights."""
    carrier = rows["tailnum"]
    return rows.arr_delay, helper(flight_key=1), "flight-delay"
'''
    got = sorted(names_of_flights(sample))
    assert got == ["6: 'carrier'", "6: 'tailnum'", "7: 'arr_delay'", "7: 'flight-delay'", "7: 'flight_key'"]
