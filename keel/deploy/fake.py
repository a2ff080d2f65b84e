"""``FakeDeployer`` — a named fake of the model runtime, for unit tests of rollout decisions (no Triton).

It does what ``gpu_runtime.deploy.Deployer`` does to the state around Triton — checks each target's text against
its sha256 (Triton's load refuses a tampered file the same way), keeps which versions are "loaded", writes the
next routing table atomically where the gateway would read it — and nothing to a server. Rollback, canary and
experiment decisions are tested against it in milliseconds; the real deployer is tested against a real Triton.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from keel.deploy.routing import DeployReport, ModelDeployer, RoutingTable, Target, Variant, next_table
from keel.errors import KeelError
from keel.storage import write_json_atomic


class FakeDeployError(KeelError):
    """A target whose text does not match its sha256: what a tampered model file makes Triton's load do."""


class FakeDeployer(ModelDeployer):
    """In-memory ``ModelDeployer`` (a fake): ``loaded`` is what would be in Triton, ``routing_path`` is real."""

    def __init__(self, routing_path: str | Path, n_features: int):
        super().__init__(routing_path)
        self.n_features = n_features
        self.loaded: dict[tuple[str, int], str] = {}  # (model, version) → sha256
        self.deploys: list[RoutingTable] = []

    def deploy(
        self,
        model: str,
        targets: list[Target],
        *,
        fallback: Target | None = None,
        experiments: dict[str, tuple[Variant, ...]] | None = None,
        coarse: Target | None = None,
    ) -> DeployReport:
        current = self.current()
        table = next_table(
            current, model, self.n_features, targets, fallback=fallback, experiments=experiments, coarse=coarse
        )
        for t in [*targets, *([fallback] if fallback else [])]:
            if hashlib.sha256(t.model_text.encode()).hexdigest() != t.route.sha256:
                raise FakeDeployError(f"{model} v{t.route.version}: the model text does not match its sha256")
        serving_now = set(current.versions()) if current and current.model == model else set()
        new = sorted(set(table.versions()) - serving_now)
        retired = sorted(serving_now - set(table.versions()))
        for t in [*targets, *([fallback] if fallback else [])]:
            self.loaded[(model, t.route.version)] = t.route.sha256
        for v in retired:
            self.loaded.pop((model, v), None)
        self.publish_coarse(coarse)
        write_json_atomic(table.to_dict(), self.routing_path)
        self.deploys.append(table)
        return DeployReport(table.generation, tuple(new), tuple(retired), {v: 0.0 for v in new})
