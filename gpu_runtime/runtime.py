"""The Triton model runtime as keel sees it: where it listens, its repository, and a deployer for it.

``TritonRuntime`` is what ``resources.triton.TritonResource`` (Dagster) and the ``keel rollback`` command both use:
the running runtime (``python -m gpu_runtime.serve``) announces itself in ``<serving>/endpoints.json``; the
deployer publishes into ``<serving>/model_repository`` and writes ``<serving>/routing/<model>.json``. ``deployer_for`` is
registered as the ``triton`` entry point of the ``keel.runtimes`` group (pyproject.toml): keel's library finds the
runtime through it, without importing this package.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpu_runtime.deploy import Deployer
from gpu_runtime.repository import ModelRepository, ServingConfig
from gpu_runtime.triton import TritonControl, TritonError, TritonServer
from keel.home import ServingDir

INSTANCE_KIND_ENV = "KEEL_INSTANCE_KIND"  # KIND_GPU on GPU nodes (the Kubernetes profile sets it for runs)


@dataclass(frozen=True)
class RuntimeSettings:
    instance_count: int = 1
    instance_kind: str | None = None  # None: $KEEL_INSTANCE_KIND at call time, else KIND_CPU
    max_batch_size: int = 256
    max_queue_delay_us: int = 0  # dynamic batching without a wait (gpu_runtime/repository.py ServingConfig)
    drain_s: float = 1.0
    # Fault injection for drills and tests (named as such): a path with {version}; while that file exists the
    # version fails requests (all, or the share written in the file). gpu_runtime/triton_model.py documents it.
    fault_file: str | None = None

    def kind(self) -> str:
        return self.instance_kind or os.environ.get(INSTANCE_KIND_ENV) or "KIND_CPU"


class TritonRuntime:
    def __init__(self, serving: ServingDir, settings: RuntimeSettings | None = None):
        self.layout = serving
        self.settings = settings or RuntimeSettings()

    def endpoints(self) -> dict:
        path = self.layout.endpoints
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
        return ModelRepository(self.layout.model_repository)

    def serving_config(self, n_features: int) -> ServingConfig:
        s = self.settings
        return ServingConfig(
            n_features=n_features,
            max_batch_size=s.max_batch_size,
            max_queue_delay_us=s.max_queue_delay_us,
            instance_count=s.instance_count,
            instance_kind=s.kind(),
            parameters={"keel_fault_file": s.fault_file} if s.fault_file else {},
        )

    def deployer(self, model: str, n_features: int, control: TritonControl | None = None) -> Deployer:
        """The deployer of ``model``: it writes that model's routing table (``routing/<model>.json``)."""
        return Deployer(
            control or self.control(),
            self.repository(),
            self.layout.routing_of(model),
            self.serving_config(n_features),
            drain_s=self.settings.drain_s,
        )

    def server(self) -> TritonServer:
        return TritonServer(self.layout.model_repository, self.layout.triton_dir)


def deployer_for(serving_dir: str | Path, model: str, n_features: int) -> Deployer:
    """The ``keel.runtimes`` entry point: a deployer of ``model`` for the runtime serving from ``serving_dir``."""
    return TritonRuntime(ServingDir(Path(serving_dir))).deployer(model, n_features)
