"""The data pipeline as the UI shows it: `dagster dev` (tests/webserver/conftest.py) asserted through its GraphQL API —
the asset graph and its checks, partitions and their check results, the daemon, feature and drift lineage, the online
store, frozen features."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests import REPO
from tests.dagster_support import graphql, metadata
from usecases.flights.features import FLIGHT_FEATURES

# the folder's platform is built in the first test's set-up, beside the other worker's tests (tests/parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_asset_graph_and_checks(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes { assetKey { path } groupName kinds description isPartitioned
                          dependencyKeys { path }
                          assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }""",
    )
    # every use case's assets and the platform's tell their story; flights' (and the platform's) by short name
    for node in data["assetNodes"]:
        key = "/".join(node["assetKey"]["path"])
        assert node["description"], f"{key} has no description"
        assert node["kinds"], f"{key} has no kinds"
        assert node["groupName"].removeprefix("flights_").removeprefix("hotels_") in {
            "raw", "contracts", "features", "drift", "models", "loop", "operations", "deployments", "experiments",
            "streaming", "metering",
        }, key  # fmt: skip
    assert {n["groupName"] for n in data["assetNodes"] if n["assetKey"]["path"][0] == "hotels"} >= {
        "hotels_raw",
        "hotels_contracts",
        "hotels_features",
        "hotels_models",
        "hotels_loop",
    }  # the second use case, in groups of its own
    nodes = {n["assetKey"]["path"][-1]: n for n in data["assetNodes"] if n["assetKey"]["path"][0] != "hotels"}
    assert {
        "raw_flights",
        "raw_weather",
        "raw_planes",
        "validated_flights",
        "flights_quarantine",
        "validated_weather",
        "weather_quarantine",
    } <= set(nodes)
    deps = lambda key: {d["path"][-1] for d in nodes[key]["dependencyKeys"]}  # noqa: E731
    assert deps("validated_flights") == {"raw_flights", "raw_planes"}
    assert deps("flights_quarantine") == {"raw_flights", "raw_planes"}
    assert deps("validated_weather") == {"raw_weather"}
    # What is served is metered and costed; what drives the predictions is explained from the month's features.
    assert deps("cost_report") == {"usage"} and deps("explanations") == {"flight_features"}
    shift = {c["name"]: c["blocking"] for c in nodes["explanations"]["assetChecksOrError"]["checks"]}
    assert shift == {"attribution_shift": False}
    # What drift leads to, in the lineage: a challenger, its gate, and the month's loop_report.
    assert deps("challenger_model") == {"drift_report"} and deps("challenger_evaluation") == {"challenger_model"}
    assert deps("loop_report") == {"flight_features", "drift_report"}  # its month's: the ledger says what served
    # The experiment data lake's lineage and its checks, as the UI shows them.
    assert deps("experiment_wide_table") == {"experiment_exposures"}
    assert deps("experiment_analysis") == {"experiment_wide_table", "impact_predictor"}
    assert deps("impact_predictor") == {"validated_flights"}
    exp_checks = {c["name"] for c in nodes["experiment_analysis"]["assetChecksOrError"]["checks"]}
    assert exp_checks == {"guardrails", "sample_ratio"}
    assert deps("low_visibility_effect") == {"validated_flights", "validated_weather"}
    assert deps("stream_validated_weather") == {"raw_weather", "validated_weather"}  # the Flink job's sink
    checks = {c["name"]: c["blocking"] for c in nodes["validated_weather"]["assetChecksOrError"]["checks"]}
    assert checks["conservation"] is True and checks["critical_budget"] is True
    assert checks["rule_wind_speed_physical"] is False and "schema_conformance" in checks
    assert nodes["validated_flights"]["isPartitioned"]


def test_materialized_partition_and_check_results_are_visible(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "validated_weather"]}]) {
               staleStatus(partition: "2013-02")
               assetMaterializations(partitions: ["2013-02"]) { partition metadataEntries { label ... on IntMetadataEntry { intValue } } }
               assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } }
             wind: assetCheckExecutions(assetKey: {path: ["flights", "validated_weather"]}, checkName: "rule_wind_speed_physical", limit: 50) {
               status partition run { tags { key value } } } }""",
    )
    [node] = data["assetNodes"]
    assert node["staleStatus"] == "FRESH"
    [mat] = node["assetMaterializations"]
    md = {e["label"]: e.get("intValue") for e in mat["metadataEntries"]}
    assert md["rows_in"] == 2010 and md["quarantined"] == 1 and md["valid"] == 2009
    status = {
        c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
        for c in node["assetChecksOrError"]["checks"]
    }
    assert status["conservation"] == "SUCCEEDED" and status["critical_budget"] == "SUCCEEDED"

    # the 1,048 mph reading: quarantined in February, and its rule check failed for that month only
    def run_partition(execution: dict) -> str | None:
        tags = {t["key"]: t["value"] for t in execution["run"]["tags"]}
        return execution["partition"] or tags.get("dagster/partition")

    failed = [run_partition(e) for e in data["wind"] if e["status"] == "FAILED"]
    assert set(failed) == {"2013-02"} and len({run_partition(e) for e in data["wind"]}) == 12


def test_no_loop_report_month_is_unsynced_after_the_backfill(dagster_dev):
    """Each month's loop_report depends on its month only: a deployment or a gate built after it (the backfill's
    first model, the drift sensor's challengers) does not mark every past month "Unsynced" in the UI, inviting a
    rebuild of old months against today's state."""
    months = [f"2013-{m:02d}" for m in range(1, 13)]
    fields = " ".join(f'm{i}: staleStatus(partition: "{m}") c{i}: staleCauses(partition: "{m}") {{ reason }}'
                      for i, m in enumerate(months))  # fmt: skip
    data = graphql(dagster_dev, f"""{{ assetNodes(assetKeys: [{{path: ["flights", "loop_report"]}}]) {{ {fields}
               assetMaterializations {{ partition }} }} }}""")  # fmt: skip
    [node] = data["assetNodes"]
    built = {m["partition"] for m in node["assetMaterializations"]}
    assert len(built) >= 9, built  # the backfill's months with a release to measure
    status = {m: (node[f"m{i}"], node[f"c{i}"]) for i, m in enumerate(months) if m in built}
    assert all(s == "FRESH" for s, _ in status.values()), status


def test_daemon_is_running(dagster_dev):
    deadline = time.monotonic() + 120
    while True:
        data = graphql(
            dagster_dev, "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"
        )
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        required = [s for s in statuses if s["required"]]
        if required and all(s["healthy"] for s in required):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"daemons not healthy: {statuses}")
        time.sleep(3)
    assert {"SENSOR", "SCHEDULER"} <= {s["daemonType"] for s in required}


def test_feature_and_drift_lineage(dagster_dev):
    data = graphql(dagster_dev, "{ assetNodes { assetKey { path } dependencyKeys { path } } }")
    deps = {
        n["assetKey"]["path"][-1]: {d["path"][-1] for d in n["dependencyKeys"]}
        for n in data["assetNodes"]
        if n["assetKey"]["path"][0] == "flights"
    }
    assert deps["flight_features"] == {"validated_flights", "validated_weather", "raw_planes"}
    assert deps["online_features"] == {"validated_flights", "validated_weather", "raw_planes", "flight_features"}
    assert deps["drift_reference"] == {"flight_features"}
    assert deps["drift_report"] == {"flight_features", "drift_reference"}


def test_months_that_really_shifted_are_flagged_with_their_features(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "drift_report"]}]) {
               assetMaterializations(partitions: ["2013-02", "2013-09", "2013-12"]) {
                 partition metadataEntries { label ... on TextMetadataEntry { text } } } } }""",
    )
    [node] = data["assetNodes"]
    by_month = {m["partition"]: metadata(m["metadataEntries"]) for m in node["assetMaterializations"]}
    assert by_month["2013-02"]["verdict"] == "no_drift"  # inside the reference quarter
    for month in ("2013-09", "2013-12"):  # 13 % late in September, 33 % in December
        assert "label_late15" in by_month[month]["drifted_features"], by_month[month]
        assert "carrier_delay_rate" in by_month[month]["drifted_features"]


def test_online_store_checks_pass_and_drift_sensor_runs(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "online_features"]}]) {
               assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } }
             sensorsOrError(repositorySelector: {repositoryLocationName: "keel", repositoryName: "__repository__"}) {
               ... on Sensors { results { name sensorState { status } } } } }""",
    )
    checks = {
        c["name"]: c["executionForLatestMaterialization"]["status"]
        for c in data["assetNodes"][0]["assetChecksOrError"]["checks"]
    }
    assert checks == {
        "training_serving_skew": "SUCCEEDED",
        "online_distribution": "SUCCEEDED",
        "feature_health": "SUCCEEDED",
    }
    sensors = {s["name"]: s["sensorState"]["status"] for s in data["sensorsOrError"]["results"]}
    assert sensors["flights_drift_sensor"] == "RUNNING"


def test_check_results_belong_to_their_partitions(dagster_dev):
    """Every check result is recorded for the month it judged: the partitions view shows February's 1,048 mph reading
    failing rule_wind_speed_physical and the other eleven months passing, with no unpartitioned or skipped twin."""
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["flights", "validated_weather"]}]) {
               assetCheckOrError(checkName: "rule_wind_speed_physical") { ... on AssetCheck {
                 description
                 partitionStatuses { ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } } } } } }
             wind: assetCheckExecutions(assetKey: {path: ["flights", "validated_weather"]}, checkName: "rule_wind_speed_physical",
                                        limit: 100) { status partition } }""",
    )
    check = data["assetNodes"][0]["assetCheckOrError"]
    ranges = [(r["startKey"], r["endKey"], r["status"]) for r in check["partitionStatuses"]["ranges"]]
    assert ranges == [
        ("2013-01", "2013-01", "SUCCEEDED"),
        ("2013-02", "2013-02", "FAILED"),
        ("2013-03", "2013-12", "SUCCEEDED"),
    ], ranges
    assert all(e["partition"] for e in data["wind"]), "a check result without its partition"
    assert {e["status"] for e in data["wind"]} == {"SUCCEEDED", "FAILED"}  # nothing planned-then-skipped
    # the check says what it tests and why, in the contract's own words
    assert "wind_speed outside [0, 250]" in check["description"] and "253 mph" in check["description"]


def documented_failures() -> set[tuple[str, str, str]]:
    """(asset, check, month) for every check docs/ui.md lists as failing in the backfill for a real reason."""
    text = (REPO / "docs" / "ui.md").read_text()
    section = text.split("## Checks that do not pass in the backfill", 1)[1].split("\n## ", 1)[0]
    out = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] not in ("asset", "---") and not cells[0].startswith("-"):
            for month in cells[2].split(","):
                out.add((cells[0], cells[1], month.strip()))
    return out


def test_no_check_fails_in_the_backfill_except_those_documented_as_real(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes { assetKey { path } isPartitioned
               assetChecksOrError { ... on AssetChecks { checks { name
                 executionForLatestMaterialization { status }
                 partitionStatuses { ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } } } } } } } }""",
    )
    months = [f"2013-{m:02d}" for m in range(1, 13)]
    seen = set()
    for node in data["assetNodes"]:
        asset = node["assetKey"]["path"][-1]  # the docs name assets without their use case prefix
        for check in (node["assetChecksOrError"] or {}).get("checks", []):
            statuses = (check["partitionStatuses"] or {}).get("ranges")
            if node["isPartitioned"] and statuses is not None:
                for r in statuses:
                    assert r["status"] in ("SUCCEEDED", "FAILED"), (asset, check["name"], r)
                    if r["status"] == "FAILED":
                        span = months[months.index(r["startKey"]) : months.index(r["endKey"]) + 1]
                        seen |= {(asset, check["name"], m) for m in span}
            elif (check["executionForLatestMaterialization"] or {}).get("status") == "FAILED":
                seen.add((asset, check["name"], "-"))
    documented = documented_failures()
    assert documented, "docs/ui.md lists no failing checks: the parser or the page changed"
    assert seen == documented, {
        "undocumented": sorted(seen - documented),
        "no longer failing": sorted(documented - seen),
    }


def test_frozen_features_are_an_observation_and_a_metric(dagster_dev, keel_home):
    """What the drift sensor froze after the backfill is on the feature_freezes asset and in the gateway's /metrics,
    and both agree with the online store itself."""
    from keel.features.sqlite_store import SQLiteOnlineStore

    query = """{ assetNodes(assetKeys: [{path: ["flights", "feature_freezes"]}]) { assetObservations(limit: 1) {
                   metadataEntries { label ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text } } } } }"""

    def frozen_in_store() -> set[str]:
        store = SQLiteOnlineStore(keel_home / "online" / "flights.sqlite", features=FLIGHT_FEATURES)
        try:
            return set(store.frozen())
        finally:
            store.close()

    # The sensor ticks every 60 s and may still be acting on the last drift reports: wait until what it observed
    # is what the store holds (a sensor that never observes, or observes wrongly, fails here).
    deadline = time.monotonic() + 600
    while True:
        observed = graphql(dagster_dev, query)["assetNodes"][0]["assetObservations"]
        md = metadata(observed[0]["metadataEntries"]) if observed else {}
        frozen = frozen_in_store()
        if md.get("frozen_features") == (", ".join(sorted(frozen)) or "none"):
            break
        assert time.monotonic() < deadline, (md, frozen)
        time.sleep(5)
    assert md["frozen"] == len(frozen) and frozen, "the backfill's drift should have frozen some features"
    endpoints = json.loads((keel_home / "serving" / "endpoints.json").read_text())
    with urllib.request.urlopen(f"http://{endpoints['gateway']}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    gauges = {
        line.split('feature="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("keel_features_frozen{")
    }
    assert {f for f, v in gauges.items() if v == 1} == frozen and len(gauges) >= 10
