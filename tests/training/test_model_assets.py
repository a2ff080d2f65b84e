"""The model assets in Dagster: train → evaluate (blocking gate) → promote, against a registry in a temp dir."""

import dagster as dg
import polars as pl
import pytest

import assets.models as models
from assets.partitions import monthly_2013
from keel.registry import ModelRegistry
from keel.training.model import GatePolicy
from resources import LedgerResource, ModelRegistryResource, ParquetIOManager


@pytest.fixture
def setup(tmp_path, feature_months):
    @dg.asset(key="flight_features", partitions_def=monthly_2013)
    def flight_features(context: dg.AssetExecutionContext) -> pl.DataFrame:
        """Stands in for the real asset: real features for 2013-01…02, February's rows moved on for 03…05."""
        return feature_months.filter(pl.col("sched_date").dt.strftime("%Y-%m") == context.partition_key)

    resources = {
        "io_manager": ParquetIOManager(base_dir=str(tmp_path / "storage")),
        "registry": ModelRegistryResource(root=str(tmp_path / "registry")),
        "ledger": LedgerResource(path=str(tmp_path / "ledger.sqlite")),
    }
    instance = dg.DagsterInstance.ephemeral()
    for month in ("2013-01", "2013-02", "2013-03", "2013-04", "2013-05"):
        assert dg.materialize([flight_features], partition_key=month, resources=resources, instance=instance).success
    return [flight_features, *models.model_assets], resources, instance, tmp_path / "registry"


def run_models(setup):
    all_assets, resources, instance, _ = setup
    selection = dg.AssetSelection.assets(models.DELAY_MODEL, models.MODEL_EVALUATION, models.MODEL_PROMOTION)
    return dg.materialize(
        all_assets, selection=selection, resources=resources, instance=instance, raise_on_error=False
    )


def test_gate_passes_promotes_and_retraining_gives_the_same_model(setup, monkeypatch):
    # The stand-in months (February moved on) calibrate a little worse (ECE ≈ 0.051) than real May (≈ 0.03).
    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.1))
    result = run_models(setup)
    assert result.success
    mats = {
        e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()
    }
    sha = mats["delay_model"]["sha256"].value
    assert mats["model_promotion"]["champion"].value == sha
    registry = ModelRegistry(setup[3])
    assert registry.alias("flight-delay", "champion") == sha
    assert registry.get("flight-delay", sha).metadata["train_months"] == ["2013-01", "2013-02", "2013-03"]
    again = run_models(setup)
    assert {
        e.asset_key.to_user_string(): e.materialization.metadata for e in again.get_asset_materialization_events()
    }["delay_model"]["sha256"].value == sha


def test_a_failing_gate_stops_promotion_and_says_why(setup, monkeypatch):
    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.0))  # no model is that well calibrated
    result = run_models(setup)
    [gate] = [e for e in result.get_asset_check_evaluations() if e.check_name == models.GATE_CHECK]
    assert gate.passed is False and "calibration: ECE" in gate.metadata["reasons"].value
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "model_promotion" not in materialized and "model_evaluation" in materialized
    assert ModelRegistry(setup[3]).alias("flight-delay", "champion") is None


def test_promotion_appends_the_release_to_the_ledger(setup, monkeypatch, tmp_path):
    from keel.ledger import Ledger

    monkeypatch.setattr(models, "GATE", GatePolicy(max_ece=0.1))
    result = run_models(setup)
    promotion = {
        e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()
    }["model_promotion"]
    manifest = promotion["manifest"].value
    assert set(manifest) == {"release_id", "data", "model", "infra", "policy"}
    assert manifest["model"]["parts"]["sha256"] == promotion["champion"].value
    assert set(manifest["data"]["parts"]["flight_features"]) == {"2013-01", "2013-02", "2013-03", "2013-04"}
    ledger = Ledger(tmp_path / "ledger.sqlite")
    [entry] = ledger.log()
    assert entry.release_id == manifest["release_id"] and ledger.verify().ok
    run_models(setup)  # the same release again: not appended twice
    assert len(ledger.log()) == 1
