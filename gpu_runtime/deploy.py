"""Deploying model versions to Triton with a hot swap, and the routing table the gateway follows.

``Deployer.deploy`` puts a set of registry versions into service:

1. publish each version into the model repository (complete directories, renamed into place);
2. load each new version as its own Triton model, *next to* what is serving (nothing serving is reloaded); a
   corrupt or tampered file fails that load — the deploy unloads whatever it loaded, raises, and the old versions
   serve on, untouched;
3. wait until each new version is ready, and warm it with one request — the time from the load call to that first
   response is the version's cold start;
4. write the new routing table (a JSON file, atomically, with a higher generation): the gateway switches;
5. wait ``drain_s`` (the gateway re-reads routing every ``routing_poll_s``, and requests in flight finish), then
   unload the versions no longer routed.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu_runtime.repository import ModelRepository, ServingConfig, model_config, triton_name
from gpu_runtime.triton import TritonControl, TritonError
from keel.storage import write_json_atomic


@dataclass(frozen=True)
class Route:
    name: str  # champion | challenger | fallback | any label the split uses
    version: int
    sha256: str
    weight: float = 1.0
    release_id: str | None = None


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


class Deployer:
    def __init__(
        self,
        control: TritonControl,
        repository: ModelRepository,
        routing_path: str | Path,
        serving: ServingConfig,
        *,
        drain_s: float = 1.0,
        ready_timeout_s: float = 60.0,
    ):
        self.control = control
        self.repository = repository
        self.routing_path = Path(routing_path)
        self.serving = serving
        self.drain_s = drain_s
        self.ready_timeout_s = ready_timeout_s

    def current(self) -> RoutingTable | None:
        return RoutingTable.read(self.routing_path)

    def deploy(
        self,
        model: str,
        targets: list[Target],
        *,
        fallback: Target | None = None,
        experiments: dict[str, tuple[Variant, ...]] | None = None,
    ) -> DeployReport:
        if not targets:
            raise ValueError("deploy needs at least one target")
        current = self.current()
        serving_now = set(current.versions()) if current and current.model == model else set()
        wanted = [*targets, *([fallback] if fallback else [])]
        for t in wanted:
            self.repository.publish(model, t.route.version, t.model_text, {"sha256": t.route.sha256, **t.meta})
        wanted_versions = {t.route.version for t in wanted}
        reconfigured = {  # serving already, but with another configuration (batching, instances, parameters)
            v
            for v in wanted_versions & serving_now
            if self.repository.loaded_config(model, v) != model_config(model, v, self.serving)
        }
        new_versions = sorted((wanted_versions - serving_now) | reconfigured)
        cold: dict[int, float] = {}
        loaded: list[int] = []
        try:
            for version in new_versions:
                config = model_config(model, version, self.serving)
                started = time.perf_counter()
                self.control.load(config["name"], config)  # TritonError when the file is corrupt or tampered
                self.repository.write_config(config)  # what it is loaded with, once it is
                loaded.append(version)
                self._wait_ready(model, version)
                self.control.infer(config["name"], version, np.zeros((1, self.serving.n_features), dtype=np.float32))
                cold[version] = time.perf_counter() - started
        except Exception:
            for version in loaded:  # leave Triton as it was: only what was serving stays loaded
                if version not in serving_now:
                    self.control.unload(triton_name(model, version))
            raise
        table = RoutingTable(
            generation=(current.generation + 1) if current else 1,
            model=model,
            n_features=self.serving.n_features,
            routes=tuple(t.route for t in targets),
            fallback=fallback.route if fallback else None,
            experiments=experiments or {},
            updated_at=time.time(),
        )
        write_json_atomic(table.to_dict(), self.routing_path)
        retired = sorted(serving_now - set(table.versions()))
        if retired:
            time.sleep(self.drain_s)  # the gateway picks up the new generation; in-flight requests finish
            for version in retired:
                self.control.unload(triton_name(model, version))
        return DeployReport(table.generation, tuple(new_versions), tuple(retired), cold)

    def _wait_ready(self, model: str, version: int) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.control.ready(triton_name(model, version), version):
            if time.monotonic() > deadline:
                raise TritonError(
                    f"{model} version {version} loaded but not ready after {self.ready_timeout_s:.0f} s"
                )
            time.sleep(0.02)
