"""Finding the model runtime from keel's library, without importing it: the ``keel.runtimes`` entry points.

A runtime package registers a factory ``(serving_dir, model, n_features) -> ModelDeployer`` under a name in
pyproject.toml (``triton = "gpu_runtime.runtime:deployer_for"``). ``$KEEL_RUNTIME`` picks one (default
``triton``). This is how ``keel rollback`` reaches Triton while keel/ imports nothing of gpu_runtime/.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

from keel.deploy.routing import ModelDeployer
from keel.errors import KeelError

GROUP = "keel.runtimes"
RUNTIME_ENV = "KEEL_RUNTIME"


class RuntimeNotFoundError(KeelError):
    """No installed runtime has the name asked for."""


def load_deployer(serving_dir: str | Path, model: str, n_features: int, runtime: str | None = None) -> ModelDeployer:
    name = runtime or os.environ.get(RUNTIME_ENV) or "triton"
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        installed = ", ".join(sorted(found)) or "none"
        raise RuntimeNotFoundError(
            f"no model runtime named {name!r} is installed (entry points {GROUP}: {installed}); "
            "scripts/setup installs keel with the triton runtime"
        )
    return found[name].load()(Path(serving_dir), model, n_features)
