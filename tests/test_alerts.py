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
