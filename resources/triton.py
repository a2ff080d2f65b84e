"""Triton as a Dagster resource: the server process, its model repository, model control and the routing table.

``TritonResource`` works against the model runtime that ``python -m gpu_runtime.serve`` runs (scripts/up starts it):
it reads where Triton listens and the admin key from ``$KEEL_HOME/serving/endpoints.json``. ``server()`` gives a
``TritonServer`` on the same repository for a process that owns Triton itself (tests, a one-off deployment).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg

from gpu_runtime.deploy import Deployer
from gpu_runtime.repository import ModelRepository, ServingConfig
from gpu_runtime.triton import TritonControl, TritonError, TritonServer
from resources.parquet_io import keel_home


class TritonResource(dg.ConfigurableResource):
    serving_dir: str | None = None  # default $KEEL_HOME/serving
    instance_count: int = 1
    # KIND_CPU here and in CI; KIND_GPU on GPU nodes (the Kubernetes profile sets KEEL_INSTANCE_KIND for runs)
    instance_kind: str = os.environ.get("KEEL_INSTANCE_KIND", "KIND_CPU")
    max_batch_size: int = 256
    max_queue_delay_us: int = 200
    drain_s: float = 1.0
    # Fault injection for drills and tests (named as such): a path with {version}; while that file exists the
    # version fails requests (all, or the share written in the file). gpu_runtime/triton_model.py documents it.
    fault_file: str | None = None

    def root(self) -> Path:
        return Path(self.serving_dir) if self.serving_dir else keel_home() / "serving"

    def endpoints(self) -> dict:
        path = self.root() / "endpoints.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise TritonError(
                f"the model runtime is not running: no {path}. Start it with `.venv/bin/python -m gpu_runtime.serve` "
                "(scripts/up does)"
            ) from None

    def control(self) -> TritonControl:
        ep = self.endpoints()
        control = TritonControl(ep["triton_grpc"], ep.get("admin_key"))
        if not control.server_ready():
            raise TritonError(f"Triton at {ep['triton_grpc']} (endpoints.json) is not answering")
        return control

    def repository(self) -> ModelRepository:
        return ModelRepository(self.root() / "model_repository")

    def serving_config(self, n_features: int) -> ServingConfig:
        return ServingConfig(
            n_features=n_features,
            max_batch_size=self.max_batch_size,
            max_queue_delay_us=self.max_queue_delay_us,
            instance_count=self.instance_count,
            instance_kind=self.instance_kind,
            parameters={"keel_fault_file": self.fault_file} if self.fault_file else {},
        )

    def deployer(self, n_features: int, control: TritonControl | None = None) -> Deployer:
        return Deployer(
            control or self.control(),
            self.repository(),
            self.root() / "routing.json",
            self.serving_config(n_features),
            drain_s=self.drain_s,
        )

    def server(self) -> TritonServer:
        return TritonServer(self.root() / "model_repository", self.root() / "triton")
