"""A use case's generated pipeline materialized by real Dagster on a home, asset by asset name, for the use cases'
tests (tests/usecases/test_hotels.py, the rooms pipeline)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from assets.pipeline import usecase_assets
from keel.usecase import UseCase
from resources import TritonResource, keel_resources


def pipeline_runner(uc: UseCase, home: Path, instance: dg.DagsterInstance | None = None):
    """``run(names, partition=None)`` — materialize the named assets of ``uc``'s pipeline (asserting success) — and
    the keys by name."""
    graph = list(usecase_assets(uc))
    resources = keel_resources(home, triton=TritonResource(home=str(home), drain_s=0.3))
    instance = instance or dg.DagsterInstance.ephemeral()
    by_name = {k.path[-1]: k for a in graph for k in ([a.key] if isinstance(a, dg.AssetSpec) else a.keys)}

    def run(names: list[str], partition: str | None = None) -> dg.ExecuteInProcessResult:
        result = dg.materialize(graph, selection=[by_name[n] for n in names], partition_key=partition,
                                resources=resources, instance=instance)  # fmt: skip
        assert result.success
        return result

    return run, by_name
