"""The real thing: `dagster dev` (webserver + daemon) on 127.0.0.1, asserted through its GraphQL API.

This is what the README's main command serves. As scripts/up does, into a throwaway KEEL_HOME: the model runtime
starts, then `dagster dev`, then scripts/materialize.py launches the defined jobs through the webserver for all
twelve months, so every check has results and every run belongs to a job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import REPO
from usecases.flights.features import FLIGHT_FEATURES

pytestmark = pytest.mark.slow

DAGSTER = str(Path(sys.executable).with_name("dagster"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str) -> dict:
    body = json.dumps({"query": query}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        payload = json.loads(resp.read())
    assert "errors" not in payload, payload.get("errors")
    return payload["data"]


def home_env(home: Path) -> dict[str, str]:
    """The environment scripts/up gives its children: no Triton admin key (only the runtime holds it; deployments
    read it from the runtime's 0600 endpoints.json). The platform tests play flights alone (``KEEL_USECASES``, as
    a user limits scripts/up): the second use case's pipeline has its own tests (tests/usecases/test_hotels.py), and
    playing both here would add its backfill and live runs to the suite's time."""
    env = os.environ | {
        "KEEL_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "KEEL_USECASES": "flights",
    }
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    return env


@pytest.fixture(scope="module")
def keel_home(tmp_path_factory) -> Path:
    """A KEEL_HOME with the model runtime (Triton + gateway) running, as scripts/up starts it."""
    home = tmp_path_factory.mktemp("keel_home")
    (home / "dagster_home").mkdir()
    shutil.copy(REPO / "scripts" / "dagster.yaml", home / "dagster_home" / "dagster.yaml")  # as scripts/env.sh
    env = home_env(home)
    serve = subprocess.Popen(
        [sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(free_port())],
        cwd=REPO,
        env=env,
        stdout=open(home / "serve.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (home / "serving" / "endpoints.json").exists():
            assert serve.poll() is None and time.monotonic() < deadline, (home / "serve.log").read_text()[-3000:]
            time.sleep(0.2)
        yield home
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)


@pytest.fixture(scope="module")
def dagster_dev(keel_home):
    """`dagster dev` on a free loopback port, and the pipeline materialized through it by scripts/materialize.py."""
    home, env = keel_home, home_env(keel_home)
    port, internal = free_port(), free_port()  # the UI's port (the guard, keel/uiguard.py) and the webserver's
    log = open(home / "dagster_dev.log", "wb")
    guard = subprocess.Popen(
        [sys.executable, "-m", "keel.uiguard", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{internal}"],
        cwd=REPO, env=env, stdout=open(home / "uiguard.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    proc = subprocess.Popen(
        [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(internal)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # dagster dev spawns the webserver, daemon and code server: stop them as a group
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dagster dev did not come up: {(home / 'dagster_dev.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(1)
        # The whole pipeline — through training, promotion and deployment — launched through the webserver.
        done = subprocess.run(
            [sys.executable, "scripts/materialize.py", "--port", str(port)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        (home / "materialize.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield port
    finally:
        guard.terminate()
        guard.wait(timeout=30)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a LISTEN socket on ``port``, read from the kernel's tables (/proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                local, state = line.split()[1], line.split()[3]
                addr_hex, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port:
                    if len(addr_hex) == 8:
                        found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr_hex)[::-1]))
                    else:
                        raw = b"".join(bytes.fromhex(addr_hex[i : i + 8])[::-1] for i in range(0, 32, 8))
                        found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def test_binds_loopback_only(dagster_dev):
    addresses = listening_addresses(dagster_dev)
    assert addresses == {"127.0.0.1"}, addresses


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
    assert deps("loop_report") == {"flight_features", "drift_report", "model_deployment", "challenger_evaluation"}
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


def metadata(entries: list[dict]) -> dict:
    out = {}
    for e in entries:
        out[e["label"]] = e.get("intValue", e.get("text", e.get("jsonString", e.get("mdStr"))))
    return out


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


def forged_post(port: int, query: str, headers: dict[str, str]) -> tuple[int, dict]:
    """A GraphQL POST to the UI with the given Host/Origin headers (http.client sends exactly what it is told)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"query": query}).encode()
    conn.putrequest("POST", "/graphql", skip_host=True)
    sent = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", **headers}
    for name, value in sent.items():
        conn.putheader(name, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, data


def run_count(port: int) -> int:
    return len(graphql(port, "{ runsOrError { ... on Runs { results { runId } } } }")["runsOrError"]["results"])


def test_the_ui_refuses_a_forged_host_or_a_foreign_origin_and_launches_nothing(dagster_dev):
    """DNS rebinding (a page whose name now resolves to 127.0.0.1: Host is its name) and a cross-site POST (Origin
    is the other page) both try `launchRun` of the rollback job; the UI's guard refuses both, nothing is launched,
    and the UI itself — same address, same origin, or no Origin at all (scripts) — still works."""
    launch = """mutation { launchRun(executionParams: {selector: {repositoryLocationName: "keel",
        repositoryName: "__repository__", jobName: "rollback_job"}, runConfigData: {}}) { __typename } }"""
    before = run_count(dagster_dev)
    status, body = forged_post(dagster_dev, launch, {"Host": f"evil.example:{dagster_dev}"})
    assert status == 403 and body["error"]["code"] == "host_not_allowed", body
    status, body = forged_post(dagster_dev, launch, {"Origin": "https://evil.example"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", body
    status, body = forged_post(dagster_dev, launch, {"Origin": "null"})  # a sandboxed page or a file:// one
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", body
    assert run_count(dagster_dev) == before
    status, body = forged_post(
        dagster_dev, "{ version }", {"Host": f"localhost:{dagster_dev}", "Origin": f"http://localhost:{dagster_dev}"}
    )
    assert status == 200 and body["data"]["version"], body


def test_the_uis_websocket_passes_the_guard_only_from_the_ui(dagster_dev):
    """GraphQL subscriptions (live run logs) are a WebSocket: the handshake from the UI's own origin is forwarded
    (101), one from another page is refused."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{dagster_dev}/graphql"
    with connect(url, origin=f"http://127.0.0.1:{dagster_dev}", subprotocols=["graphql-ws"], open_timeout=60) as ws:
        assert ws.subprotocol == "graphql-ws"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="https://evil.example", subprotocols=["graphql-ws"], open_timeout=60)
    assert refused.value.response.status_code == 403


def test_the_webserver_does_not_hold_the_triton_admin_key(dagster_dev, keel_home):
    """Only the model runtime holds the key; deployments (runs) read it from its 0600 endpoints.json — and did:
    the backfill deployed the champion (test_the_deployed_champion_answers_through_the_gateway)."""
    key = json.loads((keel_home / "serving" / "endpoints.json").read_text())["admin_key"]
    assert (keel_home / "serving" / "endpoints.json").stat().st_mode & 0o077 == 0
    webservers = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if (
            any(b"dagster_webserver" in c or c.endswith(b"dagster-webserver") for c in cmdline)
            and str(keel_home).encode() in environ
        ):
            webservers.append(environ)
    assert webservers, "no dagster webserver process of this test's home found"
    for environ in webservers:
        assert b"KEEL_TRITON_ADMIN_KEY" not in environ and key.encode() not in environ
