"""What the tests that run the real Dagster webserver share: its command, a free loopback port, a GraphQL call, the
environment scripts/up gives its children, and the kernel's view of who listens where."""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request
from pathlib import Path

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
        "KEEL_REPLAY": "1",  # a past period replayed, as scripts/up says (no wall-clock freshness: docs/ui.md)
    }
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    return env


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


def metadata(entries: list[dict]) -> dict:
    out = {}
    for e in entries:
        out[e["label"]] = e.get("intValue", e.get("text", e.get("jsonString", e.get("mdStr"))))
    return out
