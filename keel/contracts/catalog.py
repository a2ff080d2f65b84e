"""Where this deployment's data contracts live — the one place that says so: ``$KEEL_CONTRACTS_DIR``, else the
contracts folder of the installed use case (keel/usecase.py; one YAML file per contract)."""

from __future__ import annotations

import os
from pathlib import Path

from keel.names import validate_name

CONTRACTS_ENV = "KEEL_CONTRACTS_DIR"


def contracts_dir() -> Path:
    given = os.environ.get(CONTRACTS_ENV)
    if given:
        return Path(given)
    from keel.usecase import only

    return only().contracts


def contract_path(name: str) -> Path:
    """The YAML file of contract ``name`` (a validated name: it becomes a path)."""
    return contracts_dir() / f"{validate_name(name, what='contract name')}.yaml"


def compiled_contract(name: str):
    """Contract ``name``, loaded and compiled (``keel.contracts.engine.CompiledContract``)."""
    from keel.contracts.engine import CompiledContract
    from keel.contracts.spec import load_contract

    return CompiledContract(load_contract(contract_path(name)))
