"""The model as the UI shows it: `dagster dev` (tests/webserver/conftest.py) asserted through its GraphQL API — the
model's lineage and its gate, the registered champion answering through the gateway, the causal question answered,
every run of a defined job and re-executable."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import REPO
from tests.dagster_support import graphql, home_env

pytestmark = pytest.mark.slow


def test_model_lineage_and_quality_gate(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "delay_model"]}, {path: ["flights", "model_evaluation"]}, {path: ["flights", "model_promotion"]}]) {
               assetKey { path } dependencyKeys { path } kinds
               assetChecksOrError { ... on AssetChecks { checks { name blocking executionForLatestMaterialization { status } } } } } }""",
    )
    nodes = {n["assetKey"]["path"][-1]: n for n in data["assetNodes"]}
    assert {d["path"][-1] for d in nodes["delay_model"]["dependencyKeys"]} == {"flight_features"}
    assert "model" in nodes["delay_model"]["kinds"]
    assert {d["path"][-1] for d in nodes["model_promotion"]["dependencyKeys"]} == {"model_evaluation"}
    [gate] = nodes["model_evaluation"]["assetChecksOrError"]["checks"]
    assert (
        gate["name"] == "quality_gate"
        and gate["blocking"]
        and gate["executionForLatestMaterialization"]["status"] == "SUCCEEDED"
    )


def test_raw_flights_lead_to_the_registered_champion(dagster_dev, keel_home):
    """The UI's lineage from raw flights to the model, and the registry and ledger the same run filled."""
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "validated_flights"]}, {path: ["flights", "flight_features"]}]) {
               assetKey { path } dependedByKeys { path } } }""",
    )
    children = {n["assetKey"]["path"][-1]: {d["path"][-1] for d in n["dependedByKeys"]} for n in data["assetNodes"]}
    assert "flight_features" in children["validated_flights"] and "delay_model" in children["flight_features"]

    from keel.registry import ModelRegistry

    registry = ModelRegistry(keel_home / "registry")
    champion = registry.alias("flight-delay", "champion")
    meta = registry.get("flight-delay", champion).metadata
    assert set(meta["data_versions"]["flights/flight_features"]) == {"2013-01", "2013-02", "2013-03"}
    assert all(meta["data_versions"]["flights/flight_features"].values())  # real data versions, none missing
    assert set(meta["contracts"]) == {"flights", "weather"} and meta["metrics"]["auc"] > 0.6
    registry.load(champion)  # the file is there and hashes to its name

    keel = str(Path(sys.executable).with_name("keel"))
    now = subprocess.run(
        [keel, "ledger", "at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())],
        capture_output=True,
        text=True,
        env=home_env(keel_home),
        cwd=REPO,
    )
    assert now.returncode == 0 and champion in now.stdout
    impact = subprocess.run(
        [keel, "lineage", "impact", "flights/raw_flights"], capture_output=True, text=True, cwd=REPO
    )
    assert impact.returncode == 0 and "delay_model" in impact.stdout and "model_promotion" in impact.stdout


def test_the_deployed_champion_answers_through_the_gateway(dagster_dev, keel_home):
    """What scripts/up leaves running: the registry's champion served by Triton behind the gateway, live in the
    ledger, and the deployment asset in the UI with its metadata."""
    endpoints = json.loads((keel_home / "serving" / "endpoints.json").read_text())
    from keel.registry import ModelRegistry

    registry = ModelRegistry(keel_home / "registry")
    champion = registry.alias("flight-delay", "champion")
    version = registry.version("flight-delay", champion)
    body = {
        "flight": {
            "carrier": "UA",
            "flight": 1545,
            "origin": "EWR",
            "dest": "IAH",
            "tailnum": "N14228",
            "year": 2013,
            "month": 12,
            "day": 30,
            "hour": 5,
            "distance": 1400,
            "time_hour": "2013-12-30T10:00:00Z",
        },
        "unit_id": "webserver-test",
    }
    req = urllib.request.Request(
        f"http://{endpoints['gateway']}/v1/predict",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.loads(resp.read())
        assert resp.headers["x-model-signature"] == champion
    assert answer["model_version"] == version and 0 < answer["score"] < 1
    assert "missing_features_defaulted" not in answer["degraded"]  # the online store knows December's flights
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "model_deployment"]}]) { dependencyKeys { path } kinds
               assetMaterializations(limit: 1) { metadataEntries { label ... on TextMetadataEntry { text } } } } }""",
    )
    [node] = data["assetNodes"]
    assert {d["path"][-1] for d in node["dependencyKeys"]} == {"model_promotion"}
    assert "triton" in node["kinds"]
    [mat] = node["assetMaterializations"]
    release = next(e["text"] for e in mat["metadataEntries"] if e["label"] == "release_id")
    assert release == answer["release_id"]


def test_the_causal_question_is_answered_on_the_real_data(dagster_dev):
    """low_visibility_effect ran in the backfill on all of 2013: low visibility at the origin delays departures."""
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "low_visibility_effect"]}]) {
               assetMaterializations(limit: 1) { metadataEntries { label
                 ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue } } } } }""",
    )
    [mat] = data["assetNodes"][0]["assetMaterializations"]
    entries = {e["label"]: e for e in mat["metadataEntries"]}
    assert entries["estimate"]["floatValue"] > 0 and entries["rows"]["intValue"] == 40_000


def test_setup_runs_belong_to_defined_jobs_and_can_be_reexecuted(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ runsOrError(filter: {tags: [{key: "keel/source", value: "scripts/up"}]}) {
               ... on Runs { results { runId jobName status tags { key value } } } } }""",
    )
    runs = data["runsOrError"]["results"]
    by_job: dict[str, list] = {}
    for run in runs:
        by_job.setdefault(run["jobName"], []).append(run)
    assert set(by_job) == {
        "flights_reference_tables",
        "flights_monthly",
        "flights_models",
        "flights_drift",
        "flights_causal",
    }
    assert len(by_job["flights_monthly"]) == 12 and len(by_job["flights_drift"]) == 12
    assert all(r["status"] == "SUCCESS" for r in runs)
    # Re-execute the reference tables' run from the UI's API, as the "Re-execute" button does; it runs again.
    parent = by_job["flights_reference_tables"][0]["runId"]
    launched = graphql(
        dagster_dev,
        f"""mutation {{ launchRunReexecution(reexecutionParams: {{parentRunId: "{parent}", strategy: ALL_STEPS}}) {{
               __typename ... on LaunchRunSuccess {{ run {{ runId }} }} ... on PythonError {{ message }} }} }}""",
    )["launchRunReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    child = launched["run"]["runId"]
    deadline = time.monotonic() + 600
    while (
        status := graphql(dagster_dev, f'{{ runOrError(runId: "{child}") {{ ... on Run {{ status }} }} }}')[
            "runOrError"
        ]["status"]
    ) not in ("SUCCESS", "FAILURE", "CANCELED"):
        assert time.monotonic() < deadline, status
        time.sleep(2)
    assert status == "SUCCESS"
