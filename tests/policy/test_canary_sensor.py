"""The canary sensor's tick against a real policy store, registry and exposure log: start, hold, advance,
promote; a breach rolls back once; every action is one policy commit with its evidence."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from gpu_runtime.gateway.exposure import ExposureLog
from keel.policy import PolicyStore
from keel.registry import ModelRegistry
from sensors.canary import tick

T0 = 1_900_000_000.0  # 2030-03-17: the exposure log's day files follow it
CANARY = {
    "model": "flight-delay",
    "champion_version": 1,
    "challenger_version": 2,
    "steps": [10, 100],
    "interval_s": 60,
    "min_samples": 50,
    "error_ratio": 1.2,
    "alpha": 0.05,
    "progress_deadline_s": 3600,
}


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


def traffic(log, start, challenger_ok=100, challenger_failed=0, champion=1000):
    for i in range(champion):
        log.append(
            {"ts": start + i * 0.01, "routed_version": 1, "model_version": 1, "status": 200, "latency_ms": 4.0}
        )
    for i in range(challenger_ok):
        log.append(
            {"ts": start + i * 0.01, "routed_version": 2, "model_version": 2, "status": 200, "latency_ms": 5.0}
        )
    for i in range(challenger_failed):  # the challenger failed; the fallback answered the user
        log.append(
            {"ts": start + i * 0.01, "routed_version": 2, "model_version": 1, "status": 200, "latency_ms": 9.0}
        )


def split(store):
    return {v["name"]: v["weight"] for v in store.state()["rollout.split"].body["variants"]}


def test_start_hold_advance_promote(world):
    store, registry, log, exposures, shas = world
    [start] = tick(store, registry, exposures, T0)
    assert start["action"] == "start" and split(store) == {"champion": 0.9, "challenger": 0.1}
    assert tick(store, registry, exposures, T0 + 1) == []  # no traffic yet: hold, nothing committed
    traffic(log, T0 + 1)
    assert tick(store, registry, exposures, T0 + 30) == []  # data, but the step is not held for an interval yet
    [advance] = tick(store, registry, exposures, T0 + 61)
    assert advance["action"] == "advance" and split(store) == {"champion": 0.0, "challenger": 1.0}
    commit = store.commit(advance["version"])
    evidence = json.loads(commit.reason)
    assert commit.author == "canary-controller" and evidence["evidence"]["challenger"]["requests"] == 100
    assert "error_rate_pvalue" in evidence["evidence"]
    assert tick(store, registry, exposures, T0 + 62) == []  # a duplicate tick: the new step has no data yet
    traffic(log, T0 + 62)
    [promote] = tick(store, registry, exposures, T0 + 125)
    assert promote["action"] == "promote" and registry.alias("flight-delay", "champion") == shas[1]
    assert store.state()["rollout"].body["state"]["status"] == "promoted"
    assert tick(store, registry, exposures, T0 + 500) == []  # finished: nothing more, ever
    assert store.verify().ok


def test_a_breach_rolls_back_once_and_never_promotes(world):
    store, registry, log, exposures, shas = world
    tick(store, registry, exposures, T0)
    traffic(log, T0 + 1, challenger_ok=60, challenger_failed=40)  # 40 % of its requests failed over to the fallback
    [rollback] = tick(store, registry, exposures, T0 + 5)  # a breach does not wait for the interval
    assert rollback["action"] == "rollback" and split(store) == {"champion": 1.0, "challenger": 0.0}
    reason = json.loads(store.commit(rollback["version"]).reason)
    assert reason["evidence"]["challenger"]["errors"] == 40 and reason["evidence"]["error_rate_pvalue"] < 0.05
    version = store.version()
    for later in (T0 + 6, T0 + 100, T0 + 1000):  # duplicate ticks, a restarted daemon: no second rollback
        assert tick(store, registry, exposures, later) == []
    assert store.version() == version and registry.alias("flight-delay", "champion") == shas[0]


def test_the_daemon_path_launches_a_deployment_run(world, tmp_path, monkeypatch):
    """evaluate_tick (what the daemon calls) resolves the sensor's run request against its target."""
    import definitions
    from resources import ModelRegistryResource, PolicyStoreResource

    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    resources = {
        "policies": PolicyStoreResource(
            path=str(tmp_path / "policies.sqlite"), registry_root=str(tmp_path / "registry")
        ),
        "registry": ModelRegistryResource(root=str(tmp_path / "registry")),
    }
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, definitions=definitions.defs, resources=resources)
        data = definitions.defs.get_sensor_def("canary_sensor").evaluate_tick(ctx)
    [request] = data.run_requests
    assert request.asset_selection == [dg.AssetKey("model_deployment")]
    assert request.tags["keel/canary_action"] == "start" and request.run_key.startswith("canary:rollout:")
