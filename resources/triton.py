"""Triton as a Dagster resource: the server process, its model repository, model control and the routing table.

``TritonResource`` works against the model runtime that ``python -m gpu_runtime.serve`` runs (scripts/up starts it):
it reads where Triton listens and the admin key from ``$KEEL_HOME/serving/endpoints.json``. ``server()`` gives a
``TritonServer`` on the same repository for a process that owns Triton itself (tests, a one-off deployment). The
work is ``gpu_runtime.runtime.TritonRuntime``'s; this class is its configuration, shown in the Dagster UI.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from gpu_runtime.deploy import Deployer
from gpu_runtime.repository import ModelRepository, ServingConfig
from gpu_runtime.runtime import RuntimeSettings, TritonRuntime
from gpu_runtime.triton import TritonControl, TritonServer
from keel.home import KeelHome, ServingDir


class TritonResource(dg.ConfigurableResource):
    serving_dir: str | None = None  # default <home>/serving
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used
    instance_count: int = 1
    # None: $KEEL_INSTANCE_KIND when the resource is used (the Kubernetes profile sets KIND_GPU on GPU nodes),
    # else KIND_CPU (here and in CI)
    instance_kind: str | None = None
    max_batch_size: int = 256
    max_queue_delay_us: int = 200
    drain_s: float = 1.0
    # Fault injection for drills and tests (named as such): a path with {version}; while that file exists the
    # version fails requests (all, or the share written in the file). gpu_runtime/triton_model.py documents it.
    fault_file: str | None = None

    def layout(self) -> ServingDir:
        return ServingDir(Path(self.serving_dir)) if self.serving_dir else KeelHome.of(self.home).serving

    def runtime(self) -> TritonRuntime:
        return TritonRuntime(
            self.layout(),
            RuntimeSettings(
                instance_count=self.instance_count,
                instance_kind=self.instance_kind,
                max_batch_size=self.max_batch_size,
                max_queue_delay_us=self.max_queue_delay_us,
                drain_s=self.drain_s,
                fault_file=self.fault_file,
            ),
        )

    def root(self) -> Path:
        return self.layout().root

    def endpoints(self) -> dict:
        return self.runtime().endpoints()

    def control(self) -> TritonControl:
        return self.runtime().control()

    def repository(self) -> ModelRepository:
        return self.runtime().repository()

    def serving_config(self, n_features: int) -> ServingConfig:
        return self.runtime().serving_config(n_features)

    def deployer(self, n_features: int, control: TritonControl | None = None) -> Deployer:
        return self.runtime().deployer(n_features, control)

    def server(self) -> TritonServer:
        return self.runtime().server()
