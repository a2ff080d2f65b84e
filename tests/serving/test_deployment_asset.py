"""The model_deployment asset against the real runtime: the champion goes live behind the gateway, a promotion is
a hot swap with the old champion as fallback, and each release is appended to the ledger."""

from __future__ import annotations

import subprocess
import sys
import time

import dagster as dg
import pytest

from keel.ledger import Ledger
from keel.registry import ModelRegistry
from keel.release import release_manifest
from resources import TritonResource, keel_resources
from tests import REPO
from tests.flights import MODEL_DEPLOYMENT, MODEL_PROMOTION, model_deployment
from tests.serving.conftest import MODEL, Runtime, request_body, start_serve, stop_serve


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    proc, endpoints = start_serve(runtime_home)
    try:
        yield Runtime(runtime_home, proc, endpoints, serving_models[0])
    finally:
        stop_serve(proc)


def promote(runtime: Runtime, instance: dg.DagsterInstance, index: int) -> dict:
    """What model_promotion does, for model ``index``: the registry alias and a materialization with the manifest."""
    registry = ModelRegistry(runtime.home / "registry")
    registry.promote(MODEL, runtime.shas[index], "test promotion")
    registry.close()
    manifest = release_manifest(
        data={"flight_features": {"2013-01": f"dv-{index}"}, "contracts": {"flights": "c1"}},
        model={"asset": "delay_model", "sha256": runtime.shas[index], "params": {"seed": index}},
        infra={},
        policy={},
    )
    instance.report_runless_asset_event(
        dg.AssetMaterialization(MODEL_PROMOTION, metadata={"candidate_manifest": dg.MetadataValue.json(manifest)})
    )
    return manifest


def deploy(runtime: Runtime, instance: dg.DagsterInstance) -> dict:
    resources = keel_resources(runtime.home, triton=TritonResource(home=str(runtime.home), drain_s=0.3))
    result = dg.materialize([model_deployment], resources=resources, instance=instance)
    assert result.success
    [event] = result.get_asset_materialization_events()
    assert event.asset_key == MODEL_DEPLOYMENT
    return {k: v.value for k, v in event.materialization.metadata.items()}


def serving_version(runtime: Runtime, body: dict, want: int, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        resp = runtime.post(body)
        if resp.status_code == 200 and resp.json()["model_version"] == want:
            return resp
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.05)


def test_deploy_promote_redeploy_and_the_ledger(runtime, serving_models):
    _, feb = serving_models
    body = request_body(feb.row(5, named=True))
    instance = dg.DagsterInstance.ephemeral()

    promote(runtime, instance, 0)
    first = deploy(runtime, instance)
    resp = serving_version(runtime, body, 1)
    assert resp.headers["x-model-signature"] == runtime.shas[0]
    assert resp.json()["release_id"] == first["release_id"]
    manifest = first["manifest"]
    assert manifest["infra"]["parts"]["triton"].startswith("2.")  # the server's own version
    assert manifest["model"]["parts"]["sha256"] == runtime.shas[0]
    assert manifest["policy"]["parts"]["gateway"] == "builtin-1" and first["fallback_version"] is None

    promote(runtime, instance, 1)  # model 2 becomes champion, model 1 archived
    second = deploy(runtime, instance)
    assert second["loaded_versions"] == "2"  # model 1 keeps serving, now as the fallback: not reloaded
    resp = serving_version(runtime, body, 2)
    assert resp.headers["x-model-signature"] == runtime.shas[1] and resp.json()["release_id"] == second["release_id"]
    assert second["fallback_version"] == 1  # the previous champion stays loaded as the breaker's fallback
    assert runtime.control.loaded_versions(MODEL) == [1, 2]

    ledger = Ledger(runtime.home / "ledger.sqlite")
    entries = ledger.log()
    assert [e.release_id for e in entries] == [first["release_id"], second["release_id"]] and ledger.verify().ok
    at = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel.cli",
            "ledger",
            "--ledger",
            str(runtime.home / "ledger.sqlite"),
            "at",
            entries[0].live_from.isoformat(),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert at.returncode == 0 and first["release_id"] in at.stdout and runtime.shas[0] in at.stdout
    again = deploy(runtime, instance)  # nothing changed: no reload, no new ledger entry
    assert again["loaded_versions"] == "none" and len(Ledger(runtime.home / "ledger.sqlite").log()) == 2


def test_rollback_from_the_shell_and_as_a_dagster_job(runtime, serving_models):
    """After the releases above (model 1, then model 2): `keel rollback` puts model 1 back — Triton, routing,
    registry, and a revert entry in the ledger — and the rollback job, run next, rolls forward to model 2 again."""
    import os

    from assets.deployment import rollback_job

    _, feb = serving_models
    body = request_body(feb.row(6, named=True))
    ledger_path = runtime.home / "ledger.sqlite"
    before = Ledger(ledger_path).log()
    assert [e.manifest["model"]["parts"]["sha256"] for e in before] == runtime.shas[:2]

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel.cli",
            "rollback",
            "--model",
            "flight-delay",
            "--reason",
            "challenger looks wrong",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ | {"KEEL_HOME": str(runtime.home)},
    )
    assert out.returncode == 0, out.stderr
    resp = serving_version(runtime, body, 1)
    assert resp.headers["x-model-signature"] == runtime.shas[0]
    entries = Ledger(ledger_path).log()
    assert (
        len(entries) == 3 and entries[-1].reverts == entries[0].seq and entries[-1].release_id == before[0].release_id
    )
    registry = ModelRegistry(runtime.home / "registry")
    assert registry.alias(MODEL, "champion") == runtime.shas[0]
    assert Ledger(ledger_path).verify().ok

    result = rollback_job.execute_in_process(
        resources=keel_resources(runtime.home, triton=TritonResource(home=str(runtime.home), drain_s=0.3)),
        run_config={"ops": {"rollback_op": {"config": {"reason": "undo the rollback", "model": MODEL}}}},
    )
    assert result.success
    [mat] = [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert mat.asset_key == MODEL_DEPLOYMENT
    resp = serving_version(runtime, body, 2)
    assert resp.headers["x-model-signature"] == runtime.shas[1]
    assert Ledger(ledger_path).log()[-1].release_id == before[1].release_id
