"""Modules stay small enough to read: at most 400 lines each in the platform, the wiring and the use cases (the
contract DSL's parser, one grammar, is the one exception), and no two modules of keel/ import each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_layering import imported_modules

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("keel", "gpu_runtime", "assets", "sensors", "resources", "usecases")
MAX_LINES = 400
EXCEPTIONS = {"keel/contracts/dsl.py"}  # the condition language's parser: one grammar, kept in one place


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_400_lines(package):
    long = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / package).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(REPO)) not in EXCEPTIONS
    }
    assert long == {}


def test_no_two_modules_import_each_other():
    imports: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            imports[module_name(path)] = {m for _, m in imported_modules(path)}
    circles = sorted(
        f"{a} <-> {b}"
        for a, targets in imports.items()
        for b in targets
        if b in imports and a < b and a in imports[b]
    )
    assert circles == []
