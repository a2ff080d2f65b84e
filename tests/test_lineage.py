"""Lineage impact and release diff, read from the Dagster asset graph of the real definitions (and of small ones)."""

import json
import subprocess
import sys
from datetime import UTC, datetime

import dagster as dg
import pytest

from definitions import defs
from keel.ledger import Ledger
from keel.lineage import LineageError, LineageGraph
from keel.release import release_manifest
from tests import REPO


@pytest.fixture(scope="module")
def graph() -> LineageGraph:
    return LineageGraph.from_definitions(defs)


def keel(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keel.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_an_asset_impacts_exactly_its_dagster_descendants(graph):
    """No hand-kept list: the answer for an asset key is Dagster's own downstream closure."""
    asset_graph = defs.resolve_asset_graph()
    for key in ("flights/raw_flights", "flights/validated_weather", "flights/flight_features", "flights/delay_model"):
        expected, frontier = set(), {dg.AssetKey.from_user_string(key)}
        while frontier:
            children = {c for k in frontier for c in asset_graph.get(k).child_keys} - expected
            expected |= children
            frontier = children
        assert {i.key for i in graph.impact(key).assets} == {k.to_user_string() for k in expected}, key


def test_a_weather_column_reaches_its_feature_and_the_model_but_not_other_features(graph):
    impact = graph.impact("flights/validated_weather.wind_speed")
    found = {i.key: i for i in impact.assets}
    assert found["flights/flight_features"].columns == ("wind_speed",)
    assert {
        "flights/delay_model",
        "flights/model_evaluation",
        "flights/model_promotion",
        "flights/drift_report",
    } <= set(found)
    assert found["flights/delay_model"].role == "model" and found["flights/flight_features"].role == "feature"
    assert "flights/validated_flights" not in found  # weather does not flow back into flights
    # A bare column name resolves to the most upstream asset publishing it.
    assert graph.impact("wind_speed").sources == ("flights/validated_weather",)


def test_a_column_no_feature_uses_does_not_reach_the_model(graph):
    impact = graph.impact("flights/validated_flights.air_time")  # known only after landing: no feature may use it
    keys = {i.key for i in impact.assets}
    assert "flights/flight_features" not in keys and "flights/delay_model" not in keys
    assert (
        "flights/online_features" in keys
    )  # it reads validated flights without publishing column lineage: assumed used


def test_arr_delay_reaches_the_label_and_the_history_rates_only(graph):
    found = {i.key: i for i in graph.impact("flights/validated_flights.arr_delay").assets}
    assert set(found["flights/flight_features"].columns) == {
        "label_late15",
        "carrier_delay_rate",
        "route_delay_rate",
        "origin_hour_delay_rate",
    }


def test_a_reference_column_decides_rows_so_it_reaches_every_validated_column(graph):
    found = {i.key: i for i in graph.impact("flights/raw_planes.tailnum").assets}
    assert "air_time" in found["flights/validated_flights"].columns  # the in_set rule on tailnum filters whole rows
    year_built = {i.key: i for i in graph.impact("flights/raw_planes.year").assets}
    assert "flights/validated_flights" not in year_built and year_built["flights/flight_features"].columns == (
        "plane_age",
    )


def test_a_new_asset_shows_up_without_anyone_listing_it():
    @dg.asset(
        metadata={
            "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn("a"), dg.TableColumn("b")]),
        }
    )
    def table():
        return None

    @dg.asset(
        deps=[table],
        metadata={
            "dagster/column_lineage": dg.TableColumnLineage(
                deps_by_column={"x": [dg.TableColumnDep(asset_key=dg.AssetKey("table"), column_name="a")]}
            )
        },
        group_name="features",
    )
    def feature_x():
        return None

    @dg.asset(deps=[feature_x], group_name="experiments")
    def uplift_analysis():
        return None

    graph = LineageGraph.from_definitions(dg.Definitions(assets=[table, feature_x, uplift_analysis]))
    by_role = graph.impact("table.a").by_role()
    assert [i.key for i in by_role["feature"]] == ["feature_x"]
    assert [i.key for i in by_role["experiment"]] == ["uplift_analysis"]
    assert graph.impact("b").assets == ()  # feature_x declares it reads only column a


def test_unknown_targets_are_clear_errors(graph):
    with pytest.raises(LineageError, match="neither an asset key nor a column"):
        graph.impact("no_such_thing")
    with pytest.raises(LineageError, match="validated_flights has no column 'nope'"):
        graph.impact("flights/validated_flights.nope")


def _manifest(feb="dv-feb-1", flights_contract="c1", seed=2013, lightgbm="4.7.0"):
    return release_manifest(
        data={
            "flights/flight_features": {"2013-01": "dv-jan", "2013-02": feb},
            "contracts": {"flights": flights_contract, "weather": "w1"},
        },
        model={"asset": "flights/delay_model", "sha256": f"m-{seed}", "params": {"seed": seed}},
        infra={"python": "3.11.7", "packages": {"lightgbm": lightgbm}},
        policy={"routing": None, "canary": None, "circuit_breaker": None},
    )


def test_diff_names_changed_parts_and_the_assets_that_produced_them(graph):
    a, b = _manifest(), _manifest(feb="dv-feb-2", flights_contract="c2", lightgbm="4.8.0")
    diffs = {d.part: d for d in graph.diff_manifests(a, b)}
    assert [p for p, d in diffs.items() if d.changed] == ["data", "infra"]
    data = diffs["data"]
    assert {c.path for c in data.changes} == {"flights/flight_features.2013-02", "contracts.flights"}
    assert set(data.producers) == {
        "flights/flight_features",
        "flights/validated_flights",
        "flights/flights_quarantine",
    }
    assert "flights/raw_flights" in data.upstream
    assert diffs["infra"].producers == () and [c.path for c in diffs["infra"].changes] == ["packages.lightgbm"]
    model = {d.part: d for d in graph.diff_manifests(a, _manifest(seed=7))}["model"]
    assert model.producers == ("flights/delay_model",) and "flights/flight_features" in model.upstream


def test_cli_diff_reads_releases_from_the_ledger(tmp_path):
    a, b = _manifest(), _manifest(feb="dv-feb-2")
    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    led.append(a["release_id"], a, datetime(2013, 6, 1, tzinfo=UTC))
    led.append(b["release_id"], b, datetime(2013, 7, 1, tzinfo=UTC))
    led.close()
    out = keel("lineage", "diff", a["release_id"][:10], b["release_id"], "--ledger", str(path))
    assert out.returncode == 0, out.stderr
    assert "data: CHANGED" in out.stdout and "model: unchanged" in out.stdout
    assert "flights/flight_features.2013-02: dv-feb-1 → dv-feb-2" in out.stdout
    assert "produced by: flights/flight_features" in out.stdout
    (tmp_path / "b.json").write_text(json.dumps(b))
    from_file = keel("lineage", "diff", a["release_id"], str(tmp_path / "b.json"), "--ledger", str(path))
    assert from_file.returncode == 0 and "changed: data" in from_file.stdout
    missing = keel("lineage", "diff", "rel-nope", b["release_id"], "--ledger", str(path))
    assert missing.returncode == 2 and "not in the ledger" in missing.stderr


def test_cli_impact(tmp_path):
    out = keel("lineage", "impact", "flights/validated_weather.wind_speed")
    assert out.returncode == 0, out.stderr
    assert (
        "flights/flight_features" in out.stdout
        and "columns wind_speed" in out.stdout
        and "flights/delay_model" in out.stdout
    )
    bad = keel("lineage", "impact", "nope")
    assert bad.returncode == 2 and "neither an asset key nor a column" in bad.stderr
    elsewhere = keel("lineage", "impact", "flights/raw_flights", cwd=tmp_path)  # no definitions.py there
    assert elsewhere.returncode == 2 and "--definitions" in elsewhere.stderr


def test_upstream_of_a_drifted_feature_names_its_source_column_contract_and_delivery(graph):
    """The root-cause question: flight_features.temp drifted — where does it come from?"""
    up = graph.upstream("flights/flight_features.temp")
    columns = {i.key: i.columns for i in up.assets}
    assert "temp" in columns["flights/validated_weather"] and "temp" in columns["flights/raw_weather"]
    assert "temp" not in columns.get("flights/raw_flights", ())  # flights only join on origin and hour
    assert "weather" in up.contracts and "flights/raw_weather" in up.roots
    assert [i.key for i in up.assets].index("flights/validated_weather") < [i.key for i in up.assets].index(
        "flights/raw_weather"
    )


def test_upstream_of_an_asset_is_exactly_its_dagster_ancestors(graph):
    asset_graph = defs.resolve_asset_graph()
    for key in ("flights/drift_report", "flights/loop_report", "flights/validated_flights"):
        expected, frontier = set(), {dg.AssetKey.from_user_string(key)}
        while frontier:
            parents = {p for k in frontier for p in asset_graph.get(k).parent_keys} - expected
            expected |= parents
            frontier = parents
        assert {i.key for i in graph.upstream(key).assets} == {k.to_user_string() for k in expected}, key


def test_cli_upstream():
    out = keel("lineage", "upstream", "flights/flight_features.temp")
    assert out.returncode == 0, out.stderr
    assert "flights/raw_weather" in out.stdout and "contracts on the way: flights, weather" in out.stdout
