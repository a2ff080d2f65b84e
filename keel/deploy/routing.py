"""What serves: the routing table the gateway follows, the targets a deployment puts into service, and the deployer
interface that does it.

The values here are pure (no Triton): ``RoutingTable`` is the JSON file the gateway reads, ``next_table`` is the
table a deployment writes, and ``ModelDeployer`` is what a runtime implements — ``gpu_runtime.deploy.Deployer``
for Triton, ``keel.deploy.fake.FakeDeployer`` (a named fake, no model runtime) for unit tests of rollout
decisions. Code in keel that changes what serves (rollback, the rollout decisions) takes a ``ModelDeployer``.
"""

from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from keel.errors import KeelError
from keel.storage import _atomic

CHAMPION = "champion"  # the route that answers by default; with the fallback, the only one a retry may go to


@dataclass(frozen=True)
class Route:
    name: str  # champion | challenger | fallback | any label the split uses
    version: int
    sha256: str
    weight: float = 1.0
    release_id: str | None = None
    # A regression version's prediction interval, from its registry record: (coverage, half-width, the label's spread
    # or None) (keel/intervals.py)
    interval: tuple[float, float, float | None] | None = None

    def __post_init__(self) -> None:
        if self.interval is not None:  # read back from JSON as a list (an older table's without a spread)
            spread = self.interval[2] if len(self.interval) > 2 and self.interval[2] is not None else None
            object.__setattr__(
                self,
                "interval",
                (float(self.interval[0]), float(self.interval[1]), None if spread is None else float(spread)),
            )


@dataclass(frozen=True)
class Variant:
    name: str
    route: str  # a Route.name
    weight: float


@dataclass(frozen=True)
class RoutingTable:
    generation: int
    model: str
    n_features: int
    routes: tuple[Route, ...]
    fallback: Route | None = None
    experiments: dict[str, tuple[Variant, ...]] = field(default_factory=dict)
    updated_at: float = 0.0
    # The coarse model the gateway answers from when no version of the model can (a version of <model>-coarse,
    # scored in the gateway's process from coarse_path(); not a Triton model: not in versions()).
    coarse: Route | None = None

    def versions(self) -> list[int]:
        return sorted({r.version for r in self.routes} | ({self.fallback.version} if self.fallback else set()))

    def route(self, name: str) -> Route:
        for r in self.routes:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "model": self.model,
            "n_features": self.n_features,
            "routes": [asdict(r) for r in self.routes],
            "fallback": asdict(self.fallback) if self.fallback else None,
            "experiments": {k: [asdict(v) for v in vs] for k, vs in self.experiments.items()},
            "updated_at": self.updated_at,
            "coarse": asdict(self.coarse) if self.coarse else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoutingTable:
        return cls(
            generation=int(d["generation"]),
            model=d["model"],
            n_features=int(d["n_features"]),
            routes=tuple(Route(**r) for r in d["routes"]),
            fallback=Route(**d["fallback"]) if d.get("fallback") else None,
            experiments={k: tuple(Variant(**v) for v in vs) for k, vs in (d.get("experiments") or {}).items()},
            updated_at=float(d.get("updated_at", 0.0)),
            coarse=Route(**d["coarse"]) if d.get("coarse") else None,
        )

    @classmethod
    def read(cls, path: str | Path) -> RoutingTable | None:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            return None


@dataclass(frozen=True)
class Target:
    """A registry version to serve, with its text model."""

    route: Route
    model_text: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeployReport:
    generation: int
    loaded: tuple[int, ...]  # versions (re)loaded: new ones, and serving ones whose configuration changed
    unloaded: tuple[int, ...]
    cold_start_s: dict[int, float]  # new version → load call to first response


def coarse_path(routing_path: str | Path, sha256: str) -> Path:
    """Where a deployment puts a coarse model's text for the gateway that follows ``routing_path``: beside the
    routing tables, named by its sha256 (which the gateway checks when it loads it)."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256: {sha256!r}")
    return Path(routing_path).parent / "coarse" / f"{sha256}.txt"


class ModelDeployer(ABC):
    """Puts registry versions into service; what serves now is the routing table it writes at ``routing_path``."""

    def __init__(self, routing_path: str | Path):
        self.routing_path = Path(routing_path)

    def current(self) -> RoutingTable | None:
        return RoutingTable.read(self.routing_path)

    def publish_coarse(self, coarse: Target | None) -> None:
        """Write the coarse model's text where the gateway reads it (atomically; content-addressed, so a file that
        exists is already right) — before the routing table that names it."""
        if coarse is None:
            return
        data = coarse.model_text.encode()
        if hashlib.sha256(data).hexdigest() != coarse.route.sha256:
            raise ValueError(f"coarse model v{coarse.route.version}: the text does not match its sha256")
        path = coarse_path(self.routing_path, coarse.route.sha256)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic(path, lambda fh: fh.write(data))

    @abstractmethod
    def deploy(
        self,
        model: str,
        targets: list[Target],
        *,
        fallback: Target | None = None,
        experiments: dict[str, tuple[Variant, ...]] | None = None,
        coarse: Target | None = None,
    ) -> DeployReport: ...


def next_table(
    current: RoutingTable | None,
    model: str,
    n_features: int,
    targets: list[Target],
    *,
    fallback: Target | None = None,
    experiments: dict[str, tuple[Variant, ...]] | None = None,
    now: float | None = None,
    coarse: Target | None = None,
) -> RoutingTable:
    """The routing table a deployment of ``targets`` writes: the next generation, the targets' routes."""
    if not targets:
        raise ValueError("deploy needs at least one target")
    return RoutingTable(
        generation=(current.generation + 1) if current else 1,
        model=model,
        n_features=n_features,
        routes=tuple(t.route for t in targets),
        fallback=fallback.route if fallback else None,
        experiments=experiments or {},
        updated_at=time.time() if now is None else now,
        coarse=coarse.route if coarse else None,
    )


class ReplicaDeployError(KeelError):
    """A deployment to several runtimes stopped at one of them (named); the ones before it serve the new versions."""


class ReplicatedDeployer(ModelDeployer):
    """One deployment to every runtime replica (each its own Triton and routing table, ``KeelHome.replica``): the
    replicas are deployed one after another — a rolling deployment, so that while one loads, the others serve. Each
    replica's own deployer hot-swaps as for a single runtime (and leaves that replica as it was if its load fails);
    a failure stops the roll-out there and raises naming the replica, the ones before it serving the new versions
    (run the deployment again, or roll back: both go to every replica)."""

    def __init__(self, deployers: dict[str, ModelDeployer]):
        if not deployers:
            raise ValueError("a replicated deployment needs at least one replica")
        self.deployers = dict(deployers)
        first = next(iter(self.deployers.values()))
        super().__init__(first.routing_path)  # current(): the first replica's table (all equal once deployed)
        self.reports: dict[str, DeployReport] = {}

    def deploy(
        self,
        model: str,
        targets: list[Target],
        *,
        fallback: Target | None = None,
        experiments: dict[str, tuple[Variant, ...]] | None = None,
        coarse: Target | None = None,
    ) -> DeployReport:
        self.reports = {}
        for name, deployer in self.deployers.items():
            try:
                self.reports[name] = deployer.deploy(
                    model, targets, fallback=fallback, experiments=experiments, coarse=coarse
                )
            except Exception as exc:
                done = ", ".join(self.reports) or "none"
                raise ReplicaDeployError(
                    f"deployment of {model} stopped at replica {name!r}: {exc} (already deployed: {done})"
                ) from exc
        reports = list(self.reports.values())
        return DeployReport(
            generation=max(r.generation for r in reports),
            loaded=tuple(sorted({v for r in reports for v in r.loaded})),
            unloaded=tuple(sorted({v for r in reports for v in r.unloaded})),
            cold_start_s={
                v: max(r.cold_start_s.get(v, 0.0) for r in reports) for r in reports for v in r.cold_start_s
            },
        )
