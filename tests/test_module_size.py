"""Modules stay small enough to read, and no import goes round in a circle.

- **Size**: every Python module of the repository (each folder of it: the platform, the wiring, the use cases, the
  scripts, the benchmarks, the tests) is at most 400 lines *as the formatter would write it*: a line packed under
  ``# fmt: skip`` counts as the lines ``ruff format`` makes of it. The contract DSL's parser, one grammar, is the one
  exception.
- **Cycles**: no cycle of imports of any length among the repository's modules (``from pkg import mod`` is an import
  of ``pkg.mod``; a relative import is resolved), and no cycle among the folders of keel/ and gpu_runtime/ (a
  folder's module importing another folder's whose modules import back).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.test_layering import import_statements

MAX_LINES = 400
EXCEPTIONS = {"keel/contracts/dsl.py"}  # the condition language's parser: one grammar, kept in one place
_SKIP = re.compile(r"[ \t]*# fmt: skip\b")
RUFF = Path(sys.executable).parent / "ruff"


def python_files(root: Path = REPO) -> list[Path]:
    """Every .py file of the repository: its top-level modules and every folder but environments and hidden ones."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p.startswith(".") or p in ("node_modules", "build", "dist") for p in rel[:-1]):
            continue
        out.append(path)
    return out


def formatted_lines(path: Path) -> int:
    """How many lines ``path`` has once every ``# fmt: skip`` is lifted and the formatter has run."""
    text = _SKIP.sub("", path.read_text())
    done = subprocess.run([str(RUFF), "format", "--stdin-filename", str(path), "-"], input=text,
                          capture_output=True, text=True, cwd=path.parent, check=True)  # fmt: skip
    return len(done.stdout.splitlines())


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The repository's modules ``path`` (module ``name``) imports, anywhere in it (functions, TYPE_CHECKING)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for _, module, level, names in import_statements(path):
        base = ".".join(package[: len(package) - level + 1] + ([module] if module else [])) if level else module
        found.update({f"{base}.{n}" if f"{base}.{n}" in known else base for n in names} if names else {base})
    return {m for m in found if m in known and m != name}


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in python_files(root)}
    return {name: imports_of(path, name, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one node (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return sorted(found)


def folder_graph(graph: dict[str, set[str]], platform: tuple[str, ...] = ("keel", "gpu_runtime")) -> dict:
    """The imports between the folders of the platform: ``keel.loop.freeze`` → ``keel.training.model`` is an arrow
    keel.loop → keel.training (a top-level module such as keel.usecase is a folder of its own)."""

    def folder(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] in platform and len(parts) > 1 else None

    arrows: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = folder(source), folder(target)
            if a and b and a != b:
                arrows.setdefault(a, set()).add(b)
    return arrows


def test_no_module_is_over_400_lines_as_formatted():
    long = {
        rel: n
        for path in python_files()
        if (rel := str(path.relative_to(REPO))) not in EXCEPTIONS and (n := formatted_lines(path)) > MAX_LINES
    }
    assert long == {}


def test_no_import_cycle_among_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_among_the_platforms_folders():
    assert cycles(folder_graph(import_graph())) == []


def test_the_rules_see_packed_lines_long_cycles_and_submodule_imports(tmp_path):
    """The rules themselves: a packed line counts as formatted, a three-module cycle through ``from pkg import mod``
    and a relative import is found, and so is a package whose ``__init__`` and modules import each other."""
    packed = tmp_path / "packed.py"
    packed.write_text("x = dict(a=1,\n  b=2)  # fmt: skip\n" + "y = [" + ", ".join(f"'{'v' * 30}{i}'" for i in range(9)) + "]  # fmt: skip\n")  # fmt: skip
    assert len(packed.read_text().splitlines()) == 3
    assert formatted_lines(packed) == 1 + 11  # the dict joins onto one line; the list takes one line per item

    pkg = tmp_path / "pkg"
    (pkg / "rules").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "rules" / "__init__.py").write_text("from pkg.rules import one\n")
    (pkg / "rules" / "one.py").write_text("from pkg.rules import Base\n")
    graph = import_graph(tmp_path)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.rules", "pkg.rules.one"]]
    assert cycles({"keel.a": {"keel.b"}, "keel.b": {"keel.a"}, "keel.c": {"keel.a"}}) == [["keel.a", "keel.b"]]


@pytest.mark.parametrize(
    "arrows, loops",
    [
        ({"keel.training.coarse": {"keel.usecase_parts"}, "keel.usecase_parts": {"keel.loop.recipes"},
          "keel.loop.freeze": {"keel.training.model"}, "keel.training.model": set(), "keel.loop.recipes": set()},
         [["keel.loop", "keel.training", "keel.usecase_parts"]]),
        ({"keel.contracts.rules.range": {"keel.contracts.model"}, "keel.contracts.engine": {"keel.contracts.rules"}},
         []),  # a nested folder using its parent's modules is one folder of keel: no loop
    ],
)  # fmt: skip
def test_the_folder_rule_finds_a_loop_through_three_folders(arrows, loops):
    assert cycles(folder_graph(arrows)) == loops
