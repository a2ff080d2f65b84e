"""The UI as an attacker meets it: the webserver binds loopback only, keel's guard refuses a forged Host or a
foreign Origin (nothing launched) and lets the UI's own WebSocket through, and the webserver never holds the
Triton admin key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.dagster_support import graphql, listening_addresses

pytestmark = pytest.mark.slow


def test_binds_loopback_only(dagster_dev):
    addresses = listening_addresses(dagster_dev)
    assert addresses == {"127.0.0.1"}, addresses


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
