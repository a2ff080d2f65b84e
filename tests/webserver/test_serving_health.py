"""What actually answered, as a user finds it in the UI: a home whose serving failed on a day (a planted tenth of its
answers by the coarse model with the breaker open, and timeouts) gets a failed `serving_objective` check and a
`degraded_serving` incident, read through GraphQL; a healthy day fails nothing and opens no incident. Each day is
metered by the defined `keel_metering` job launched through the webserver, as a user does from the UI (the metering
sensor's cursor is past these 2013 days: it meters the days as the gateway's clock finishes them), and the watchdog
refreshes the incidents asset by itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from keel.exposure_log import ExposureLog
from tests.dagster_support import graphql
from tests.live_platform import wait_until

MODEL = "flight-delay"
DEGRADED, HEALTHY = "2013-05-01", "2013-08-01"


def plant(home) -> None:
    log = ExposureLog(home / "serving" / "exposures", prefix="exposures")
    degraded = datetime(2013, 5, 1, 12, tzinfo=UTC).timestamp()
    healthy = datetime(2013, 8, 1, 12, tzinfo=UTC).timestamp()
    for i in range(1000):
        if i < 850:
            r = {"status": 200, "model_version": 1}
        elif i < 970:
            r = {"status": 200, "model_version": None, "variant": "coarse", "degraded": ["breaker_open"]}
        else:
            r = {"status": 504, "error": "deadline_exceeded"}
        assert log.append({"ts": degraded + i, "model": MODEL, "latency_ms": 3.0, "request_id": f"planted-{i}"} | r)
    for i in range(500):
        assert log.append({"ts": healthy + i, "model": MODEL, "status": 200, "model_version": 1, "latency_ms": 3.0,
                           "request_id": f"healthy-{i}"})  # fmt: skip
    log.close()


def meter(port: int, day: str) -> dict:
    """Launch keel_metering for ``day`` through the webserver and wait for it; its serving_objective execution."""
    from dagster_graphql import DagsterGraphQLClient

    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    run_id = client.submit_job_execution("keel_metering", repository_location_name="keel",
                                         tags={"dagster/partition": day})  # fmt: skip
    status = wait_until(f"the metering run of {day}", lambda: (s := client.get_run_status(run_id).value) in (
        "SUCCESS", "FAILURE", "CANCELED") and s, 600, 2)  # fmt: skip
    assert status == "SUCCESS", run_id
    data = graphql(port, """{ assetCheckExecutions(assetKey: {path: ["serving_health"]},
                                checkName: "serving_objective", limit: 50) {
                         status runId evaluation { metadataEntries { label ... on MarkdownMetadataEntry { mdStr } } } } }""")  # fmt: skip
    # the run's result (an unpartitioned check of a partitioned run also records a skipped planned execution)
    [execution] = [e for e in data["assetCheckExecutions"] if e["runId"] == run_id and e["status"] != "SKIPPED"]
    return execution


def incident_keys(port: int) -> list[str]:
    data = graphql(port, """{ assetNodes(assetKeys: [{path: ["incidents"]}]) { assetMaterializations(limit: 1) {
                       metadataEntries { label ... on TableMetadataEntry { table { records } } } } } }""")  # fmt: skip
    mats = data["assetNodes"][0]["assetMaterializations"]
    if not mats:
        return []
    [table] = [e["table"] for e in mats[0]["metadataEntries"] if e["label"] == "table"]
    return [json.loads(r)["key"] for r in table["records"]]


def test_a_failed_day_fails_the_serving_check_and_opens_an_incident_and_a_healthy_day_does_not(
    dagster_dev, keel_home
):
    plant(keel_home)
    healthy = meter(dagster_dev, HEALTHY)
    assert healthy["status"] == "SUCCEEDED"
    degraded = meter(dagster_dev, DEGRADED)
    assert degraded["status"] == "FAILED"
    why = {m["label"]: m.get("mdStr") for m in degraded["evaluation"]["metadataEntries"]}["why"]
    assert f"{MODEL} {DEGRADED}" in why and "12.0% answered by a fallback" in why and "deadline_exceeded 30" in why
    keys = wait_until("the incidents asset shows the degraded day",
                      lambda: (k := incident_keys(dagster_dev)) and f"degraded_serving:{MODEL}:{DEGRADED}" in k and k,
                      300, 3)  # fmt: skip
    assert f"degraded_serving:{MODEL}:{HEALTHY}" not in keys
