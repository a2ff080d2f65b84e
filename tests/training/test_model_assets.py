"""The model assets in Dagster: train → evaluate (blocking gate) → promote, against a registry in a temp dir."""

import json

import dagster as dg
import polars as pl
import pytest

import assets.models as models
import tests.flights as flights
from keel.registry import ModelRegistry
from keel.training.model import GatePolicy
from resources import keel_resources


@pytest.fixture
def setup(tmp_path, feature_months):
    @dg.asset(key=["flights", "flight_features"], partitions_def=flights.monthly)
    def flight_features(context: dg.AssetExecutionContext) -> pl.DataFrame:
        """Stands in for the real asset: real features for 2013-01…02, February's rows moved on for 03…05."""
        return feature_months.filter(pl.col("sched_date").dt.strftime("%Y-%m") == context.partition_key)

    resources = keel_resources(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    for month in ("2013-01", "2013-02", "2013-03", "2013-04", "2013-05"):
        assert dg.materialize([flight_features], partition_key=month, resources=resources, instance=instance).success
    return [flight_features, *flights.model_assets], resources, instance, tmp_path / "registry"


def run_models(setup):
    all_assets, resources, instance, _ = setup
    selection = dg.AssetSelection.assets(flights.DELAY_MODEL, flights.MODEL_EVALUATION, flights.MODEL_PROMOTION)
    return dg.materialize(
        all_assets, selection=selection, resources=resources, instance=instance, raise_on_error=False
    )


def test_gate_passes_promotes_and_retraining_gives_the_same_model(setup, monkeypatch):
    # The stand-in months (February moved on) calibrate a little worse (ECE ≈ 0.051) than real May (≈ 0.03).
    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.1))
    result = run_models(setup)
    assert result.success
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    sha = mats["delay_model"]["sha256"].value
    assert mats["model_promotion"]["champion"].value == sha
    registry = ModelRegistry(setup[3])
    assert registry.alias("flight-delay", "champion") == sha
    assert registry.alias("flight-delay", "challenger") == sha  # named challenger once its gate passed
    assert registry.get("flight-delay", sha).metadata["train_months"] == ["2013-01", "2013-02"]
    again = run_models(setup)
    assert {e.asset_key.path[-1]: e.materialization.metadata for e in again.get_asset_materialization_events()}[
        "delay_model"
    ]["sha256"].value == sha


def test_a_failing_gate_stops_promotion_and_says_why(setup, monkeypatch):
    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.0))  # no model is that well calibrated
    result = run_models(setup)
    [gate] = [e for e in result.get_asset_check_evaluations() if e.check_name == models.GATE_CHECK]
    assert gate.passed is False and "calibration: ECE" in gate.metadata["reasons"].value
    materialized = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    assert "model_promotion" not in materialized and "model_evaluation" in materialized
    registry = ModelRegistry(setup[3])
    assert registry.alias("flight-delay", "champion") is None
    assert registry.alias("flight-delay", "challenger") is None  # a refused model is no challenger: never served


def test_promotion_builds_the_candidate_release_manifest(setup, monkeypatch, tmp_path):
    from keel.ledger import Ledger

    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.1))
    result = run_models(setup)
    promotion = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}[
        "model_promotion"
    ]
    manifest = promotion["candidate_manifest"].value
    assert set(manifest) == {"release_id", "data", "model", "infra", "policy"}
    assert manifest["model"]["parts"]["sha256"] == promotion["champion"].value
    assert set(manifest["data"]["parts"]["flights/flight_features"]) == {"2013-01", "2013-02", "2013-03"}
    assert manifest["data"]["parts"]["contracts"] == models.contract_hashes(flights.CONTRACTS)
    # Promotion is not going live: only model_deployment appends to the ledger.
    assert Ledger(tmp_path / "ledger.sqlite").log() == []


def test_the_registry_records_data_versions_contracts_metrics_and_run(setup, monkeypatch):
    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.1))
    _, _, instance, registry_root = setup
    result = run_models(setup)
    sha = registry_sha(result)
    meta = ModelRegistry(registry_root).get("flight-delay", sha).metadata
    for month, version in meta["data_versions"]["flights/flight_features"].items():
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flights", "flight_features"]), asset_partitions=[month]),
            limit=1,
        ).records
        assert version == record.asset_materialization.tags["dagster/data_version"]
    assert set(meta["data_versions"]["flights/flight_features"]) == {"2013-01", "2013-02", "2013-03"}
    assert meta["contracts"] == models.contract_hashes(flights.CONTRACTS) and set(meta["contracts"]) == {
        "flights",
        "weather",
    }
    assert meta["params"]["seed"] == flights.CONFIG.params["seed"]
    assert 0.6 < meta["metrics"]["auc"] < 1 and meta["metrics"]["holdout_month"] == "2013-03"
    assert meta["run_id"] == result.run_id and meta["gate"]["passed"] is True


def registry_sha(result) -> str:
    return {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}[
        "delay_model"
    ]["sha256"].value


def test_editing_a_contract_marks_the_model_stale(setup, tmp_path):
    from dagster._core.definitions.data_version import StaleStatus
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from tests import CONTRACTS

    all_assets, resources, instance, _ = setup
    copies = []
    for name in ("flights.yaml", "weather.yaml"):
        (tmp_path / name).write_text((CONTRACTS / name).read_text())
        copies.append(tmp_path / name)
    stand_in = all_assets[0]
    v1 = [stand_in, *models.build_model_assets(flights.FLIGHTS, tuple(copies))]
    assert dg.materialize(v1, selection=[flights.DELAY_MODEL], resources=resources, instance=instance).success
    assert get_stale_status_resolver(instance, v1).get_status(flights.DELAY_MODEL) == StaleStatus.FRESH

    contract = copies[0].read_text()
    copies[0].write_text(contract.replace("max_fraction: 0.02", "max_fraction: 0.03"))
    v2 = [stand_in, *models.build_model_assets(flights.FLIGHTS, tuple(copies))]
    resolver = get_stale_status_resolver(instance, v2)
    assert resolver.get_status(flights.DELAY_MODEL) == StaleStatus.STALE
    [cause] = resolver.get_stale_causes(flights.DELAY_MODEL)
    assert cause.category.name == "CODE" and "code version" in cause.reason


def test_a_new_release_diffs_to_the_partition_and_the_model_that_changed(
    setup, monkeypatch, tmp_path, feature_months
):
    """Re-materialize February with one carrier's flights gone, retrain, promote; `keel lineage diff` of the two
    candidate releases names the changed partition and the new model, and what produced them."""
    import subprocess
    import sys

    from tests import REPO

    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.1, max_auc_drop=0.05))
    all_assets, resources, instance, _ = setup
    first_run = run_models(setup)
    assert first_run.success

    @dg.asset(key=["flights", "flight_features"], partitions_def=flights.monthly)
    def flight_features(context: dg.AssetExecutionContext) -> pl.DataFrame:
        month = feature_months.filter(pl.col("sched_date").dt.strftime("%Y-%m") == context.partition_key)
        return month.filter(pl.col("carrier") != "EV")  # a feed that lost one carrier

    assert dg.materialize([flight_features], partition_key="2013-02", resources=resources, instance=instance).success
    second = dg.materialize(
        [flight_features, *flights.model_assets],
        selection=dg.AssetSelection.assets(flights.DELAY_MODEL, flights.MODEL_EVALUATION, flights.MODEL_PROMOTION),
        resources=resources,
        instance=instance,
    )
    assert second.success
    first, second = (
        {e.asset_key.path[-1]: e.materialization.metadata for e in r.get_asset_materialization_events()}[
            "model_promotion"
        ]["candidate_manifest"].value
        for r in (first_run, second)
    )
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    out = subprocess.run(
        [sys.executable, "-m", "keel.cli", "lineage", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("data: CHANGED") for line in lines)
    assert any(line.strip().startswith("flights/flight_features.2013-02:") for line in lines)
    assert not any(line.strip().startswith("flights/flight_features.2013-01:") for line in lines)  # January untouched
    assert any(line.startswith("model: CHANGED") for line in lines) and "sha256:" in out.stdout
    assert "produced by: flights/flight_features" in out.stdout and "produced by: flights/delay_model" in out.stdout
    assert "infra: unchanged" in out.stdout and "policy: unchanged" in out.stdout
