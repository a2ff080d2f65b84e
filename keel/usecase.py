"""A use case, declared: the one object an engineer writes to put a model on keel.

A use case lives in a package of its own (``usecases/<name>/``) whose ``usecase`` attribute is a ``UseCase``; keel
finds it through the ``keel.usecases`` entry-point group (pyproject.toml), so keel/ and gpu_runtime/ never import a
use case by name. Frozen dataclasses, not a pydantic model or a Dagster Component: the declaration is Python that
an engineer reads and edits beside the functions it names (feature functions, readers), its types are checked when
it is built (``__post_init__``), and it does not move with Dagster's component API. docs/usecases.md walks through
every field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

from keel.errors import KeelError
from keel.features.spec import FeatureSet

ENTRY_POINTS = "keel.usecases"
USECASE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")  # an asset-key prefix and a path part
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
METRICS = {"binary": ("auc", "log_loss"), "regression": ("rmse", "mae")}


class UseCaseError(KeelError):
    """A use case declaration is invalid, or none of that name is installed."""


@dataclass(frozen=True)
class ModelSpec:
    """The model a use case trains and serves. ``name``: the served name (Triton's, the gateway route's,
    the registry's); ``asset``: the Dagster asset that trains it."""

    name: str
    asset: str = "model"

    def __post_init__(self) -> None:
        if not MODEL_NAME.fullmatch(self.name):
            raise UseCaseError(f"model name {self.name!r}: 1…64 of a-z 0-9 _ -, starting with a letter or digit")


@dataclass(frozen=True)
class Serving:
    """How requests reach the model: ``request_contract`` is the contract (in the use case's contracts folder)
    each entity of a request is validated with; ``alias`` the single-entity field of the legacy route, if any."""

    request_contract: str
    alias: str | None = None


@dataclass(frozen=True, eq=False)
class UseCase:
    name: str
    title: str
    contracts: Path
    features: FeatureSet
    model: ModelSpec
    serving: Serving
    metrics: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not USECASE_NAME.fullmatch(self.name):
            raise UseCaseError(f"use case name {self.name!r}: 1…31 of a-z 0-9 _, starting with a letter")
        if not self.contracts.is_dir():
            raise UseCaseError(f"use case {self.name}: contracts folder {self.contracts} does not exist")
        if not (self.contracts / f"{self.serving.request_contract}.yaml").is_file():
            raise UseCaseError(
                f"use case {self.name}: request contract {self.serving.request_contract}.yaml is not in {self.contracts}"
            )
        allowed = METRICS[self.features.label.task]
        if not self.metrics:
            object.__setattr__(self, "metrics", allowed)
        unknown = [m for m in self.metrics if m not in allowed]
        if unknown:
            raise UseCaseError(
                f"use case {self.name}: metrics {unknown} do not judge a {self.features.label.task} model "
                f"(one of {', '.join(allowed)})"
            )

    @property
    def task(self) -> str:
        return self.features.label.task

    def contract_path(self, name: str) -> Path:
        return self.contracts / f"{name}.yaml"


@cache
def installed() -> dict[str, UseCase]:
    """Every use case the ``keel.usecases`` entry points name, loaded and validated, by name."""
    out: dict[str, UseCase] = {}
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            uc = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken package is named, not a traceback from importlib
            raise UseCaseError(f"use case entry point {ep.name} ({ep.value}) failed to load: {exc}") from exc
        if not isinstance(uc, UseCase):
            raise UseCaseError(f"use case entry point {ep.name} ({ep.value}) is a {type(uc).__name__}, not a UseCase")
        if uc.name != ep.name:
            raise UseCaseError(f"use case entry point {ep.name} names a use case called {uc.name}")
        out[uc.name] = uc
    return out


def from_module(module: str) -> UseCase:
    """The ``usecase`` of a package by its import path (``usecases.flights``): for processes that run without
    keel's installed metadata (the Flink environment imports keel from PYTHONPATH)."""
    import importlib

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        raise UseCaseError(f"{module!r} is not a module path")
    uc = getattr(importlib.import_module(module), "usecase", None)
    if not isinstance(uc, UseCase):
        raise UseCaseError(f"module {module} has no `usecase` declaration (a keel.usecase.UseCase)")
    return uc


def get(name: str) -> UseCase:
    """The installed use case ``name``; an unknown name lists the installed ones."""
    found = installed()
    if name not in found:
        raise UseCaseError(f"no use case {name!r} is installed; installed: {', '.join(sorted(found)) or 'none'}")
    return found[name]


def by_model(model: str) -> UseCase:
    """The installed use case that serves ``model``."""
    for uc in installed().values():
        if uc.model.name == model:
            return uc
    served = sorted(uc.model.name for uc in installed().values())
    raise UseCaseError(f"no installed use case serves model {model!r}; served: {', '.join(served) or 'none'}")


def only() -> UseCase:
    """The one installed use case, for commands that take none; with several installed, the caller must name one."""
    found = installed()
    if len(found) != 1:
        raise UseCaseError(f"{len(found)} use cases are installed ({', '.join(sorted(found))}): name one")
    return next(iter(found.values()))
