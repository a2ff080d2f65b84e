"""BENCHMARKS.md: every section that reports a result names the command that reproduces it (issue 46 item 12) —
a figure nobody can rerun is a claim, not a measurement."""

from __future__ import annotations

import re

from tests import REPO

COMMAND = re.compile(r"(\.venv/bin/(python|pip)|scripts/[\w-]+|bench/\w+\.py|python3? -m |pytest)")


def sections(text: str) -> list[tuple[str, str]]:
    out, heading, body = [], None, []
    for line in text.splitlines():
        if line.startswith("#"):
            if heading is not None:
                out.append((heading, "\n".join(body)))
            heading, body = line, []
        else:
            body.append(line)
    if heading is not None:
        out.append((heading, "\n".join(body)))
    return out


def without_command(text: str) -> list[str]:
    """The sections (## and deeper; the title's introduction is none) with a body that names no command."""
    return [h for h, body in sections(text) if h.startswith("##") and body.strip() and not COMMAND.search(body)]


def test_every_section_with_results_names_its_command():
    assert without_command((REPO / "BENCHMARKS.md").read_text()) == []


def test_the_check_finds_a_section_without_a_command():
    text = "# B\n\n## A bench\n\n`bench/a.py` 12 ms\n\n### A result\n\n| way | ms |\n|---|---|\n| x | 3 |\n"
    assert without_command(text) == ["### A result"]
