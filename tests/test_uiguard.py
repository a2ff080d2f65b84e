"""The UI's guard (keel/uiguard.py): which requests pass to the Dagster webserver, decided on the request head, and the
proxy itself in front of a real HTTP server (the gateway's /healthz, a real uvicorn app). The guard in front of the
real Dagster webserver — a forged launchRun refused, the WebSocket — is tested in tests/webserver/test_ui_guard.py."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time

import pytest

from keel.uiguard import allowed_hosts, forwarded_head, refusal
from tests import REPO

HOSTS = allowed_hosts(3000, ["keel.internal:443"])


def head(*headers: str, line: str = "POST /graphql HTTP/1.1") -> bytes:
    return "\r\n".join([line, *headers]).encode()


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        (["Host: 127.0.0.1:3000"], None),
        (["Host: localhost:3000", "Origin: http://localhost:3000"], None),
        (["host: LOCALHOST:3000", "origin: HTTP://127.0.0.1:3000"], None),  # names are case-insensitive
        (["Host: [::1]:3000"], None),
        (["Host: keel.internal:443"], None),  # listed in KEEL_UI_ALLOWED_HOSTS
        (["Host: evil.example:3000"], "host_not_allowed"),  # DNS rebinding: the page's own name
        (["Host: 127.0.0.1:3001"], "host_not_allowed"),
        (["Host: 127.0.0.1:3000", "Origin: https://evil.example"], "origin_not_allowed"),  # a cross-site POST
        (["Host: 127.0.0.1:3000", "Origin: null"], "origin_not_allowed"),
        (["Host: 127.0.0.1:3000", "Origin: https://127.0.0.1:3000"], "origin_not_allowed"),  # not this scheme
        (["Host: 127.0.0.1:3000", "Origin: http://127.0.0.1:3000.evil.example"], "origin_not_allowed"),
        ([], "bad_request"),  # no Host
        (["Host: 127.0.0.1:3000", "Host: evil.example"], "bad_request"),
        (["Host: 127.0.0.1:3000", "Origin: http://127.0.0.1:3000", "Origin: http://evil"], "bad_request"),
        (["Host: 127.0.0.1:3000", "no colon here"], "bad_request"),
    ],
)
def test_which_requests_pass(headers, code):
    why = refusal(head(*headers), HOSTS)
    assert (why[1] if why else None) == code, why


def test_each_forwarded_request_closes_its_connection_unless_it_is_a_websocket():
    plain = forwarded_head(head("Host: 127.0.0.1:3000", "Connection: keep-alive", "Keep-Alive: timeout=5"))
    assert plain.endswith(b"\r\nConnection: close") and b"keep-alive" not in plain.lower()
    ws = head("Host: 127.0.0.1:3000", "Connection: Upgrade", "Upgrade: websocket", line="GET /graphql HTTP/1.1")
    assert forwarded_head(ws) == ws


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A real HTTP server (uvicorn, the gateway's ASGI app answering /healthz) behind the guard."""
    home = tmp_path_factory.mktemp("guarded")
    upstream, port = free_port(), free_port()
    app = subprocess.Popen(
        [sys.executable, "-c", (
            "import uvicorn; from pathlib import Path; from gpu_runtime.gateway.app import Gateway, GatewayConfig; "
            f"h = Path({str(home)!r}); uvicorn.run(Gateway(GatewayConfig(triton_url='127.0.0.1:1', "
            "routing_path=h / 'routing.json', exposure_dir=h / 'exp', usecase='flights')), host='127.0.0.1', "
            f"port={upstream}, log_level='warning')"
        )], cwd=REPO,
    )  # fmt: skip
    guard = subprocess.Popen(
        [sys.executable, "-m", "keel.uiguard", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}"],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            if request(port, "GET", "/healthz")[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline and app.poll() is None and guard.poll() is None
        time.sleep(0.1)
    yield port
    guard.terminate()
    app.terminate()
    guard.wait(timeout=30)
    app.wait(timeout=30)


def request(port: int, method: str, path: str, headers: dict | None = None, body: bytes = b""):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest(method, path, skip_host=True)
    for name, value in ({"Host": f"127.0.0.1:{port}"} | (headers or {})).items():
        conn.putheader(name, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, resp


def test_the_guard_forwards_the_uis_requests_and_answers_the_rest_itself(guarded):
    status, data, resp = request(guarded, "GET", "/healthz")
    assert status == 200 and json.loads(data)["status"] == "ok"
    assert resp.getheader("connection") == "close"  # one request per connection: every head is checked
    status, data, _ = request(guarded, "POST", "/v1/predict", {"Origin": f"http://127.0.0.1:{guarded}"}, b"{}")
    assert status == 503 and json.loads(data)["error"]["code"] == "not_deployed"  # the upstream's own answer
    status, data, _ = request(guarded, "POST", "/v1/predict", {"Host": f"evil.example:{guarded}"}, b"{}")
    assert status == 403 and json.loads(data)["error"]["code"] == "host_not_allowed"
    status, data, _ = request(guarded, "POST", "/v1/predict", {"Origin": "https://evil.example"}, b"{}")
    assert status == 403 and json.loads(data)["error"]["code"] == "origin_not_allowed"
