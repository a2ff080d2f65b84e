"""The Flink environment the `flink` tests run in (.venv-flink, built by scripts/test; KEEL_FLINK_PYTHON moves it)."""

from __future__ import annotations

import os
from pathlib import Path

from tests import REPO

FLINK_PY = Path(os.environ.get("KEEL_FLINK_PYTHON", REPO / ".venv-flink" / "bin" / "python"))


def require_flink_environment() -> None:
    """A `flink` test that runs has the Flink environment, or fails saying so: a missing environment is a broken
    set-up, not a reason to skip (``-m "not flink"`` leaves these tests out on purpose)."""
    assert FLINK_PY.exists(), (
        f"no Flink environment at {FLINK_PY}: KEEL_WITH_FLINK=1 scripts/setup creates .venv-flink"
    )
