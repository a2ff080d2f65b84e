"""The contract factory in Dagster: materialize() with partition keys, blocking checks, staleness on edit."""

from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from keel.factories.contracts import BUDGET_CHECK, CONSERVATION_CHECK, contract_assets

PARTS = dg.StaticPartitionsDefinition(["good", "bad"])
TOY_CONTRACT = """\
contract: toy
version: 1
critical_budget: {max_fraction: 0.2}
schema:
  columns:
    id: {type: int64, nullable: false}
    speed: {type: float64}
rules:
  - {id: speed_physical, type: range, column: speed, min: 0, max: 250}
"""


@dg.asset(partitions_def=PARTS)
def raw_toy(context: dg.AssetExecutionContext) -> pl.DataFrame:
    if context.partition_key == "good":
        return pl.DataFrame({"id": ["1", "2", "3", "4", "5", "6"], "speed": ["10", "12.5", "1048.36", "7", "x", "9"]})
    return pl.DataFrame({"id": ["1", "2", "3"], "speed": ["-1", "999", "5"]})  # 2 of 3 critical: over budget


@dg.asset(partitions_def=PARTS, deps=["validated_toy"])
def toy_features() -> None:
    """Stands for everything downstream of validated data."""


def toy_assets(contract_path: Path) -> list:
    return [raw_toy, contract_assets(contract_path, raw_key="raw_toy", partitions_def=PARTS), toy_features]


@pytest.fixture
def contract_file(tmp_path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(TOY_CONTRACT)
    return path


@pytest.fixture
def io(tmp_path):
    from resources import keel_resources

    return keel_resources(tmp_path)


def checks_of(result) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def test_partition_is_split_and_stored(contract_file, io, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        toy_assets(contract_file), partition_key="good", resources=io, instance=instance, raise_on_error=False
    )
    valid = pl.read_parquet(tmp_path / "storage" / "validated_toy" / "good.parquet")
    quarantine = pl.read_parquet(tmp_path / "storage" / "toy_quarantine" / "good.parquet")
    assert sorted(valid["id"].to_list()) == [1, 2, 4, 6]
    assert sorted(quarantine["_rule_id"].to_list()) == ["schema_type_speed", "speed_physical"]
    assert set(quarantine["_partition"]) == {"good"}
    checks = checks_of(result)
    assert checks[CONSERVATION_CHECK] and checks[BUDGET_CHECK] is False  # 2/6 critical > 20 %
    # the blocking budget check failed: the downstream asset did not run
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "toy_features" not in materialized and "validated_toy" in materialized


def test_within_budget_lets_downstream_run(contract_file, io):
    contract_file.write_text(TOY_CONTRACT.replace("max_fraction: 0.2", "max_fraction: 0.5"))
    result = dg.materialize(
        toy_assets(contract_file), partition_key="good", resources=io, instance=dg.DagsterInstance.ephemeral()
    )
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert {"validated_toy", "toy_quarantine", "toy_features"} <= materialized
    assert checks_of(result)["rule_speed_physical"] is False  # the rule failed on one row: visible, not blocking


def test_materialization_metadata_tells_the_story(contract_file, io):
    contract_file.write_text(TOY_CONTRACT.replace("max_fraction: 0.2", "max_fraction: 0.5"))
    result = dg.materialize(
        toy_assets(contract_file), partition_key="good", resources=io, instance=dg.DagsterInstance.ephemeral()
    )
    by_key = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    md = by_key["validated_toy"]
    assert md["rows_in"].value == 6 and md["valid"].value == 4 and md["quarantined"].value == 2
    assert md["checks_not_passed"].value == "rule_speed_physical (1 row: speed outside [0, 250])"
    rules = {r.data["rule"]: r.data for r in md["per_rule"].value.records}
    assert md["per_rule"].value.records[0].data["rule"] == "speed_physical"  # failing rules first
    assert rules["speed_physical"] == {
        "rule": "speed_physical",
        "test": "speed outside [0, 250]",
        "severity": "critical",
        "action": "quarantine",
        "failed_rows": 1,
        "pass_rate": round(5 / 6, 6),
    }
    # the quarantine sample shows the failing rule's column first, with the bad value in view
    sample = by_key["toy_quarantine"]["sample"].value
    assert [c.name for c in sample.schema.columns][:4] == ["_rule_id", "_reason", "_source_row", "speed"]
    assert "1048.36" in {r.data["speed"] for r in sample.records}
    # the rule's check names its test, and its result shows the offending row, for this partition
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "rule_speed_physical"]
    assert not check.passed and check.partition == "good"
    assert check.description.startswith("1 of 6 rows fail: speed outside [0, 250]")
    [row] = check.metadata["failing_rows"].value.records
    assert row.data["speed"] == "1048.36" and isinstance(row.data["_source_row"], int)


def test_editing_the_contract_marks_validated_and_downstream_stale(contract_file, io):
    instance = dg.DagsterInstance.ephemeral()
    contract_file.write_text(TOY_CONTRACT.replace("max_fraction: 0.2", "max_fraction: 0.5"))
    assets_v1 = toy_assets(contract_file)
    assert dg.materialize(assets_v1, partition_key="good", resources=io, instance=instance).success
    resolver = get_stale_status_resolver(instance, assets_v1)
    assert resolver.get_status(dg.AssetKey("validated_toy"), "good") == StaleStatus.FRESH
    assert resolver.get_status(dg.AssetKey("toy_features"), "good") == StaleStatus.FRESH

    contract_file.write_text(
        TOY_CONTRACT.replace("max: 250", "max: 200").replace("max_fraction: 0.2", "max_fraction: 0.5")
    )
    assets_v2 = toy_assets(contract_file)
    resolver = get_stale_status_resolver(instance, assets_v2)
    for key in ("validated_toy", "toy_quarantine"):
        assert resolver.get_status(dg.AssetKey(key), "good") == StaleStatus.STALE
        [cause] = resolver.get_stale_causes(dg.AssetKey(key), "good")
        assert cause.category.name == "CODE" and "code version" in cause.reason

    # Dagster 1.13 marks a downstream asset stale once its input has a new data version: re-validate, and
    # everything downstream of validated_toy shows stale, caused by the contract's new data.
    validate_only = dg.AssetSelection.assets("validated_toy", "toy_quarantine")
    assert dg.materialize(
        assets_v2, selection=validate_only, partition_key="good", resources=io, instance=instance
    ).success
    resolver = get_stale_status_resolver(instance, assets_v2)
    assert resolver.get_status(dg.AssetKey("validated_toy"), "good") == StaleStatus.FRESH
    assert resolver.get_status(dg.AssetKey("toy_features"), "good") == StaleStatus.STALE
    causes = resolver.get_stale_causes(dg.AssetKey("toy_features"), "good")
    assert any(c.dependency and c.dependency.asset_key == dg.AssetKey("validated_toy") for c in causes)


def test_reference_pipeline_partition(io):
    """One real month through the reference definitions: raw → validated + quarantine with every check."""
    import definitions

    all_assets = list(definitions.defs.assets)
    instance = dg.DagsterInstance.ephemeral()
    reference_tables = dg.AssetSelection.assets(
        *(["flights", t] for t in ("raw_planes", "raw_airlines", "raw_airports"))
    )
    assert dg.materialize(all_assets, selection=reference_tables, resources=io, instance=instance).success
    contracts = dg.AssetSelection.assets(
        *(["flights", name] for name in ("raw_flights", "raw_weather", "validated_flights", "flights_quarantine",
                                         "validated_weather", "weather_quarantine"))
    )  # fmt: skip
    result = dg.materialize(all_assets, selection=contracts, partition_key="2013-02", resources=io, instance=instance)
    assert result.success
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert md["validated_weather"]["quarantined"].value == 1  # the 1,048 mph reading
    assert md["validated_flights"]["rows_in"].value == md["raw_flights"]["dagster/row_count"].value == 24_951
    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert checks[("validated_flights", CONSERVATION_CHECK)] and checks[("validated_weather", CONSERVATION_CHECK)]
    assert checks[("validated_flights", BUDGET_CHECK)] and checks[("validated_weather", BUDGET_CHECK)]


def test_a_breach_is_alerted_once_by_the_rules_severity(contract_file, io, tmp_path, monkeypatch):
    """Where a KEEL_HOME is set (the platform's runs), a partition's breaches are alerts by the broken rule's
    severity — the critical range rule and the exceeded critical budget page — once: rebuilding the partition (as a
    live month is, for each delivery) does not page again."""
    from keel.alerts import read_alerts

    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    for _ in range(2):
        dg.materialize(toy_assets(contract_file), partition_key="good", resources=io,
                       instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)  # fmt: skip
    alerts = read_alerts(tmp_path / "alerts" / "alerts.jsonl")
    assert sorted((a["details"]["rule"], a["severity"], a["channel"]) for a in alerts) == [
        ("critical_budget", "critical", "page"),  # 2 of 6 rows break a critical rule, over the 20 % budget
        ("schema_type_speed", "critical", "page"),  # "x" is not a number
        ("speed_physical", "critical", "page"),  # 1048.36
    ], alerts
    assert all(a["kind"] == "contract_breach" and "toy v1, good" in a["summary"] for a in alerts)
    assert len({a["once"] for a in alerts}) == len(alerts)  # each once


def test_a_partly_delivered_month_breaches_only_rules_that_allow_no_failure():
    """On the real weather: the hour that repeats when the clocks go back (3 November) is within its 0.2 % allowance
    for the month but not for the month's first days — no alert until the month is whole (then none: it is within);
    the 1,048 mph wind breaches a rule that allows nothing, partly delivered or not."""
    import polars as pl

    from keel.contracts.results import PartitionWindow
    from keel.factories.contracts import breach_alerts
    from usecases.flights import usecase as flights
    from usecases.flights.data import read_raw_month

    contract = flights.compiled_contract("weather")

    def rules(month: str, last_day: int | None, complete: bool) -> list[str]:
        raw = read_raw_month("weather", month)
        if last_day is not None:
            raw = raw.filter(pl.col("day").cast(pl.Int32) <= last_day)
        report = contract.validate(raw, PartitionWindow(month)).report
        return sorted(a.details["rule"] for a, _ in breach_alerts(contract.spec, report, complete))

    assert rules("2013-11", 3, complete=False) == []
    assert rules("2013-11", 3, complete=True) == ["one_reading_per_local_hour"]  # what a partial month looked like
    assert rules("2013-11", None, complete=True) == []
    assert rules("2013-02", 13, complete=False) == ["wind_speed_physical"]
    assert rules("2013-02", None, complete=True) == ["wind_speed_physical"]


def test_the_validation_knows_a_live_month_is_partial_from_its_raw_asset(contract_file, io, tmp_path, monkeypatch):
    """A live raw month says ``month_complete: false``: the exceeded critical budget (a share of the whole month)
    is not alerted yet; rules that allow no failure are."""
    from keel.alerts import read_alerts

    @dg.asset(name="raw_toy", partitions_def=PARTS)
    def partial_raw_toy() -> dg.Output:
        df = pl.DataFrame({"id": ["1", "2", "3", "4", "5", "6"], "speed": ["10", "12.5", "1048.36", "7", "x", "9"]})
        return dg.Output(df, metadata={"month_complete": False})

    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    assets = [partial_raw_toy, contract_assets(contract_file, raw_key="raw_toy", partitions_def=PARTS), toy_features]
    dg.materialize(assets, partition_key="good", resources=io, instance=dg.DagsterInstance.ephemeral(),
                   raise_on_error=False)  # fmt: skip
    rules = sorted(a["details"]["rule"] for a in read_alerts(tmp_path / "alerts" / "alerts.jsonl"))
    assert rules == ["schema_type_speed", "speed_physical"]
