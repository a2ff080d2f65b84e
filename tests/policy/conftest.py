"""The canary sensor's world: a real registry with flight-delay v1 (champion) and v2, a policy store holding the
rollout ``CANARY`` (tests/policy/canary_world.py), and an exposure log."""

from __future__ import annotations

import pytest

from keel.exposure_log import ExposureLog
from keel.policies import PolicyStore
from keel.registry import ModelRegistry
from tests.policy.canary_world import CANARY


@pytest.fixture
def world(tmp_path):
    registry = ModelRegistry(tmp_path / "registry")
    shas = [registry.register("flight-delay", f"model text {i}", {}).sha256 for i in (1, 2)]
    registry.promote("flight-delay", shas[0], "initial")
    store = PolicyStore(tmp_path / "policies.sqlite", versions_of=lambda m: set(registry.versions(m)))
    store.apply({"rollout": ("canary", CANARY)}, author="ops", reason="roll out model 2")
    log = ExposureLog(tmp_path / "exposures")
    yield store, registry, log, tmp_path / "exposures", shas
    log.close()
    store.close()
    registry.close()
