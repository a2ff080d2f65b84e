"""The real thing: `dagster dev` (webserver + daemon) on 127.0.0.1, asserted through its GraphQL API.

This is what the README's main command serves. One month is materialized first with scripts/materialize.py into
a throwaway DAGSTER_HOME, so the checks have results to show.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

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


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory):
    home = tmp_path_factory.mktemp("keel_home")
    env = os.environ | {"KEEL_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home")}
    (home / "dagster_home").mkdir()
    (home / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    subprocess.run(
        [sys.executable, "scripts/materialize.py", "--partitions", "2013-02"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    port = free_port()
    log = open(home / "dagster_dev.log", "wb")
    proc = subprocess.Popen(
        [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
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
        yield port
    finally:
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
    nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
    assert {
        "raw_flights",
        "raw_weather",
        "raw_planes",
        "validated_flights",
        "flights_quarantine",
        "validated_weather",
        "weather_quarantine",
    } <= set(nodes)
    deps = lambda key: {"/".join(d["path"]) for d in nodes[key]["dependencyKeys"]}  # noqa: E731
    assert deps("validated_flights") == {"raw_flights", "raw_planes"}
    assert deps("flights_quarantine") == {"raw_flights", "raw_planes"}
    assert deps("validated_weather") == {"raw_weather"}
    for key, node in nodes.items():
        assert node["description"], f"{key} has no description"
        assert node["kinds"], f"{key} has no kinds"
        assert node["groupName"] in {"raw", "contracts", "features", "drift"}
    checks = {c["name"]: c["blocking"] for c in nodes["validated_weather"]["assetChecksOrError"]["checks"]}
    assert checks["conservation"] is True and checks["critical_budget"] is True
    assert checks["rule_wind_speed_physical"] is False and "schema_conformance" in checks
    assert nodes["validated_flights"]["isPartitioned"]


def test_materialized_partition_and_check_results_are_visible(dagster_dev):
    data = graphql(
        dagster_dev,
        """{ assetNodes(assetKeys: [{path: ["validated_weather"]}]) {
               staleStatus(partition: "2013-02")
               assetMaterializations(partitions: ["2013-02"]) { partition metadataEntries { label ... on IntMetadataEntry { intValue } } }
               assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } } }""",
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
    assert status["rule_wind_speed_physical"] == "FAILED"  # the 1,048 mph reading, quarantined and visible


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
