"""The layering rules of the repository, read from the imports themselves (so they keep holding).

- ``keel/`` (the library) imports none of ``gpu_runtime/``, ``resources/``, ``assets/``, ``sensors/``,
  ``definitions``: the runtime is reached through the ``keel.runtimes`` entry points (keel/deploy/runtime.py);
- ``gpu_runtime/`` (the model runtime) imports none of ``assets/``, ``sensors/``, ``resources/``, ``definitions``;
- neither imports a use case (``usecases/``): use cases are found through the ``keel.usecases`` entry points
  (keel/usecase.py).

Every import counts: module level, inside functions, ``if TYPE_CHECKING`` blocks, and ``importlib.import_module``
with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RULES = {
    "keel": {"gpu_runtime", "resources", "assets", "sensors", "definitions", "usecases"},
    "gpu_runtime": {"assets", "sensors", "resources", "definitions", "usecases"},
}


def import_statements(path: Path) -> list[tuple[int, str, int, tuple[str, ...]]]:
    """Every import of ``path``, anywhere in it: (line, module, relative level, the names a ``from`` import takes) —
    ``import a.b`` is ``(line, "a.b", 0, ())``, ``importlib.import_module("a")`` is ``(line, "a", 0, ())``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str, int, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or "", node.level, tuple(a.name for a in node.names)))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value, 0, ()))
    return found


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of ``path`` (a relative one stays inside its own package)."""
    return [(line, module) for line, module, level, _ in import_statements(path) if not level and module]


def violations(package: str) -> list[str]:
    banned = RULES[package]
    out = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in banned:
                out.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return out


@pytest.mark.parametrize("package", sorted(RULES))
def test_layers_import_only_downwards(package):
    assert violations(package) == []


def test_the_rule_reader_sees_every_kind_of_import(tmp_path):
    """The reader itself: a banned import in each form is found (so an empty list above means something)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import gpu_runtime.triton\n"
        "from resources.triton import TritonResource\n"
        "def f():\n    from assets import deployment\n"
        "import importlib\nimportlib.import_module('sensors.canary')\n"
        "from . import sibling\n"
    )
    got = sorted(m for _, m in imported_modules(sample))
    assert got == ["assets", "gpu_runtime.triton", "importlib", "resources.triton", "sensors.canary"]
