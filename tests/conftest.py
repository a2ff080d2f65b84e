"""Shared fixtures: small contracts written as YAML text, and the repository paths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import parse_contract

REPO = Path(__file__).resolve().parent.parent
CONTRACTS = REPO / "assets" / "contracts"


def make_contract(columns: str, rules: str = "", **top: object) -> CompiledContract:
    """Build a compiled contract from YAML snippets (indentation-insensitive)."""
    header = {"contract": "t", "version": 1} | top
    head = "\n".join(f"{k}: {v}" for k, v in header.items())
    text = f"{head}\nschema:\n  columns:\n{textwrap.indent(textwrap.dedent(columns).strip(), '    ')}\n"
    if rules:
        text += "rules:\n" + textwrap.indent(textwrap.dedent(rules).strip(), "  ") + "\n"
    return CompiledContract(parse_contract(text, source="test.yaml"))


@pytest.fixture
def repo() -> Path:
    return REPO


def cupy_backend_or_none():
    """The cupy array backend when cupy sees a CUDA device, else None (GPU-marked tests skip then)."""
    from keel.kernels import ArrayBackend

    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return ArrayBackend("cupy", cupy)
    except Exception:
        return None
    return None
