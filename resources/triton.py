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
from keel.deploy.routing import ReplicatedDeployer
from keel.home import KeelHome, ServingDir


class TritonResource(dg.ConfigurableResource):
    serving_dir: str | None = None  # default <home>/serving
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used
    instance_count: int = 1
    # None: $KEEL_INSTANCE_KIND when the resource is used (the Kubernetes profile sets KIND_GPU on GPU nodes),
    # else KIND_CPU (here and in CI)
    instance_kind: str | None = None
    max_batch_size: int = 256
    max_queue_delay_us: int = 0  # dynamic batching without a wait (gpu_runtime/repository.py ServingConfig)
    drain_s: float = 1.0
    # Fault injection for drills and tests (named as such): a path with {version}; while that file exists the
    # version fails requests (all, or the share written in the file). gpu_runtime/triton_model.py documents it.
    fault_file: str | None = None

    def layout(self) -> ServingDir:
        """The configured serving directory, else the home's runtime — with several replicas, the first one running
        (its endpoints.json present)."""
        if self.serving_dir:
            return ServingDir(Path(self.serving_dir))
        return self._running()[0]

    def _running(self) -> list[ServingDir]:
        """The home's runtimes that run now (a stopped replica removed its endpoints.json), else all of them."""
        every = KeelHome.of(self.home).serving_dirs()
        return [d for d in every if d.endpoints.exists()] or every

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

    def deployer(
        self, model: str, n_features: int, control: TritonControl | None = None
    ) -> Deployer | ReplicatedDeployer:
        """The deployer of ``model`` on this runtime; with no ``serving_dir`` configured and several runtime replicas in the home
        (``$KEEL_REPLICA`` of each ``gpu_runtime.serve``), one deployment to all of them, one after another."""
        # the replicas that run now (a stopped one restores its own last routing table when it starts again —
        # docs/kubernetes.md, "What remains single-node")
        replicas = [] if self.serving_dir else self._running()
        if len(replicas) <= 1:
            return self.runtime().deployer(model, n_features, control)
        settings = self.runtime().settings
        return ReplicatedDeployer(
            {d.root.name: TritonRuntime(d, settings).deployer(model, n_features) for d in replicas}
        )

    def server(self) -> TritonServer:
        return self.runtime().server()
