"""Alerts reach a real local receiver (an HTTP server on 127.0.0.1) on the route their severity names, in the
channel's format; everything is kept in the JSONL log; a receiver that is down is recorded, not raised."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from keel.alerts import Alert, AlertConfig, AlertConfigError, AlertSender, read_alerts, route


class Receiver:
    """A webhook receiver on 127.0.0.1 recording what each path was sent."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def config_file(tmp_path: Path, receiver: Receiver) -> Path:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        f"""
channels:
  page: {{format: alertmanager, url: "{receiver.url}/api/v2/alerts"}}
  chat: {{format: slack, url_env: KEEL_TEST_CHAT_WEBHOOK}}
  mail: {{format: log}}
"""
    )
    return path


def test_each_severity_goes_where_its_route_says(tmp_path, receiver, monkeypatch):
    monkeypatch.setenv("KEEL_TEST_CHAT_WEBHOOK", f"{receiver.url}/chat")  # the secret URL from the environment
    sender = AlertSender(tmp_path / "alerts.jsonl", AlertConfig.load(config_file(tmp_path, receiver)))
    sender.send(Alert("canary_rollback", "critical", "v6 rolled back: p99 above target", {"canary": "loop-v6"}))
    sender.send(Alert("drift_freeze", "warning", "temp frozen for drift in 2013-06"))
    sender.send(Alert("canary_promote", "info", "v4 promoted"))
    paths = [p for p, _ in receiver.received]
    assert paths == ["/api/v2/alerts", "/chat"]  # info → mail: the log only
    [page] = receiver.received[0][1]  # Alertmanager: a list of alerts with labels and annotations
    assert page["labels"] == {
        "alertname": "canary_rollback",
        "severity": "critical",
        "channel": "page",
        "source": "keel",
    }
    assert page["annotations"]["summary"] == "v6 rolled back: p99 above target" and page["startsAt"]
    assert receiver.received[1][1] == {"text": "[warning] drift_freeze: temp frozen for drift in 2013-06"}
    kept = read_alerts(tmp_path / "alerts.jsonl")
    assert [(a["kind"], a["channel"], a["delivered"]) for a in kept] == [
        ("canary_rollback", "page", True),
        ("drift_freeze", "chat", True),
        ("canary_promote", "mail", None),
    ]


def test_a_receiver_that_is_down_is_recorded_not_raised(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "alerts.yaml"
    path.write_text(f'channels:\n  page: {{format: alertmanager, url: "http://127.0.0.1:{port}/x"}}\n')
    sender = AlertSender(tmp_path / "alerts.jsonl", AlertConfig.load(path))
    record = sender.send(Alert("incident", "critical", "runtime down"))
    assert record["delivered"] is False and "error" in record
    assert read_alerts(tmp_path / "alerts.jsonl")[0]["error"] == record["error"]


def test_without_configuration_nothing_leaves_the_machine(tmp_path):
    config = AlertConfig.load(tmp_path / "absent.yaml")
    assert {s: route(Alert("x", s, "y"), config).name for s in ("critical", "warning", "info")} == {
        "critical": "page",
        "warning": "chat",
        "info": "mail",
    }
    record = AlertSender(tmp_path / "a.jsonl", config).send(Alert("x", "critical", "y"))
    assert record["delivered"] is None and record["format"] == "log"


@pytest.mark.parametrize(
    "text, message",
    [
        ("routes: {urgent: page}", "routes.urgent: not a severity"),
        ("channels: {page: {format: teams}}", "channels.page.format"),
        ("channels: {page: {url: 'file:///etc/passwd'}}", "an http(s) URL"),
        ("channels: {page: {format: log, token: x}}", "unknown keys ['token']"),
        ("routes: {critical: pager}", "routes name channels that are not defined: ['pager']"),
        ("- a list", "expected a mapping"),
    ],
)
def test_a_bad_configuration_names_the_file_and_the_entry(tmp_path, text, message):
    path = tmp_path / "alerts.yaml"
    path.write_text(text)
    with pytest.raises(AlertConfigError, match=re.escape(message)) as err:
        AlertConfig.load(path)
    assert str(path) in str(err.value)


def test_an_alert_needs_a_known_severity():
    with pytest.raises(ValueError, match="severity must be one of"):
        Alert("x", "urgent", "y")


def test_every_alert_carries_the_heads_and_they_catch_a_rollback_of_every_local_file(tmp_path, receiver, monkeypatch):
    """The attacker of docs/policy.md who restores *every* local file (database, head, journal) from an older copy
    leaves nothing on this machine to contradict it — but the alerts already sent carry the heads off it, and
    `keel policy verify --head` with the one from the last alert says the store went back."""
    import os
    import shutil
    import subprocess
    import sys

    from keel.home import KeelHome
    from keel.policies import PolicyStore
    from tests import REPO

    monkeypatch.delenv("KEEL_CHAIN_KEY", raising=False)
    monkeypatch.delenv("KEEL_CONTROL_PLANE", raising=False)
    monkeypatch.setenv("KEEL_TEST_CHAT_WEBHOOK", f"{receiver.url}/chat")
    home = KeelHome(tmp_path)
    (tmp_path / "alerts.yaml").write_text(config_file(tmp_path, receiver).read_text())
    limits = lambda rps: {"limits": ("rate_limit", {"default": {"rps": rps, "burst": 10}})}  # noqa: E731
    with PolicyStore(home.policies) as store:
        store.apply(limits(10), author="ops", reason="first")
    old = tmp_path / "old"
    old.mkdir()
    for f in tmp_path.glob("policies.sqlite*"):  # database, head and journal, as they were at version 1
        shutil.copy(f, old / f.name)
    with PolicyStore(home.policies) as store:
        newest = store.apply(limits(1), author="ops", reason="tighter")
    AlertSender.for_home(home).send(Alert("drift_freeze", "warning", "temp frozen"))
    [(_, chat)] = receiver.received
    head = f"{newest.version}:{newest.hash}"
    assert chat["text"].endswith(f"(witness: policies {head})")  # the head left the machine
    assert read_alerts(tmp_path / "alerts" / "alerts.jsonl")[0]["details"]["witness"] == {"policies": head}
    for f in tmp_path.glob("policies.sqlite*"):
        f.unlink()
    for f in old.iterdir():
        shutil.copy(f, tmp_path / f.name)

    def verify(*extra):
        return subprocess.run([sys.executable, "-m", "keel.cli", "policy", "verify", *extra], capture_output=True,
                              text=True, cwd=REPO, env=os.environ | {"KEEL_HOME": str(tmp_path)})  # fmt: skip

    assert verify().returncode == 0  # nothing local contradicts the older state: what docs/policy.md says
    caught = verify("--head", f"{newest.version}:{newest.hash[:12]}")
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert f"a witness saw version {newest.version}" in caught.stdout + caught.stderr
    assert "rolled back" in caught.stdout + caught.stderr
    assert verify("--head", "2:xyz").returncode == 2  # a malformed head is a usage error
