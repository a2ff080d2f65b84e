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

import time
from pathlib import Path

import numpy as np

from gpu_runtime.repository import ModelRepository, ServingConfig, model_config, triton_name
from gpu_runtime.triton import TritonControl, TritonError
from keel.deploy.routing import DeployReport, ModelDeployer, Target, Variant, next_table
from keel.storage import write_json_atomic


class Deployer(ModelDeployer):
    """The Triton implementation of ``keel.deploy.routing.ModelDeployer``."""

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
        super().__init__(routing_path)
        self.control = control
        self.repository = repository
        self.serving = serving
        self.drain_s = drain_s
        self.ready_timeout_s = ready_timeout_s

    def deploy(
        self,
        model: str,
        targets: list[Target],
        *,
        fallback: Target | None = None,
        experiments: dict[str, tuple[Variant, ...]] | None = None,
        coarse: Target | None = None,
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
        table = next_table(
            current,
            model,
            self.serving.n_features,
            targets,
            fallback=fallback,
            experiments=experiments,
            coarse=coarse,
        )
        self.publish_coarse(coarse)  # before the table that names it
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
