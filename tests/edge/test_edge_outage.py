"""The edge and a policy store it cannot read (keel/edge/outage.py, ``EdgeFollower`` in gpu_runtime/edge_follower.py; issue 61
item 3): the last configuration stays in force, the outage is a critical incident and alert once it has lasted the
bound and recovered when the store reads again; a key revoked in any version the edge applied is refused for good,
even when a store restored from an older copy holds it again. The real Envoy and keel's edge filter, a real SQLite
store, a stand-in worker behind (tests/edge/stand_in.py)."""

from __future__ import annotations

import shutil
import time

import pytest

from gpu_runtime.edge_follower import EdgeFollower
from gpu_runtime.triton import free_port
from keel.alerts import read_alerts
from keel.edge.envoy import EdgeLimits
from keel.edge.outage import RevokedKeys, StoreOutage
from keel.home import KeelHome
from keel.incidents import IncidentLog
from keel.policies import PolicyStore
from keel.tenants import Tenant, new_key
from tests.edge.test_envoy import Worker, post

TOKEN = "edge-token-for-the-outage-test"


def test_an_outage_is_raised_once_at_its_bound_and_recovered_by_a_read():
    outage = StoreOutage(bound_s=30.0)
    assert outage.read(0.0) is None  # no outage: nothing to recover
    assert [outage.failed(t, "locked") for t in (100.0, 110.0, 129.9, 130.0, 200.0)] == [
        False,
        False,
        False,
        True,
        False,
    ]
    assert outage.read(205.0) == 105.0 and outage.since is None
    assert outage.failed(300.0, "gone") is False and outage.read(301.0) is None  # short: never raised, nothing said


def test_a_key_gone_from_a_state_seen_is_refused_for_good_and_remembered(tmp_path):
    revoked = RevokedKeys(tmp_path / "revoked_keys.json")
    assert revoked.update({"a", "b"}) == set()
    assert revoked.update({"a"}) == set()  # b revoked
    assert revoked.update({"a", "b", "c"}) == {"b"}  # an older copy holds b again: refused
    assert RevokedKeys(tmp_path / "revoked_keys.json").ids == {"b"}  # a restarted edge remembers


@pytest.fixture
def follower(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("KEEL_HOME", str(home))
    monkeypatch.setenv("KEEL_EDGE_STORE_OUTAGE_S", "1")
    (tmp_path / "workers").mkdir()
    worker = Worker(tmp_path / "workers")
    keys = {n: new_key("2013-04-01T00:00:00+00:00") for n in ("kept", "spare")}
    store_path = KeelHome(home).policies  # the embedded default: a SQLite file
    with PolicyStore(store_path) as store:
        store.apply(
            {"ops": ("tenant", Tenant("ops", tuple(s for _, s in keys.values())).as_body())},
            author="tests",
            reason="the tenant",
        )
    messages: list[str] = []
    f = EdgeFollower(
        home / "serving" / "edge", free_port(), [worker.port], ["flight-delay"], store_path, TOKEN, EdgeLimits()
    ).start(messages.append)
    yield f, home, store_path, keys, messages
    f.stop()
    worker.kill()


def tend_until(f: EdgeFollower, messages: list[str], done, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: {messages[-5:]}"
        f.tend(messages.append)
        time.sleep(0.05)


def test_an_unreadable_store_keeps_the_last_configuration_and_is_an_incident_after_the_bound(follower, tmp_path):
    f, home, store_path, keys, messages = follower
    url = f"{f.edge.url}/v1/models/flight-delay/predict"
    assert post(url, headers={"x-api-key": keys["spare"][0]})[0] == 200
    older = tmp_path / "older.sqlite"
    shutil.copy(store_path, older)  # what the store held before the revocation (v1), for later
    with PolicyStore(store_path) as store:  # spare revoked: the edge follows
        store.apply({"ops": ("tenant", Tenant("ops", (keys["kept"][1],)).as_body())}, author="tests", reason="leak")
    tend_until(f, messages, lambda: post(url, headers={"x-api-key": keys["spare"][0]})[0] == 401, "revocation")
    # the store cannot be read: a file that is not a database in its place
    store_path.rename(tmp_path / "good.sqlite")
    store_path.write_bytes(b"not a database\n" * 64)
    incidents = KeelHome(home).incidents
    tend_until(f, messages, lambda: IncidentLog(incidents).find(f.outage_key()) is not None, "the outage's incident")
    with IncidentLog(incidents) as log:
        incident = log.get(f.outage_key())
    assert incident.open and incident.severity == "critical" and "serving on policy version 2" in incident.summary
    [alert] = [a for a in read_alerts(home / "alerts" / "alerts.jsonl") if a["kind"] == "edge_policy_store"]
    assert alert["severity"] == "critical" and alert["channel"] == "page"
    assert post(url, headers={"x-api-key": keys["kept"][0]})[0] == 200  # the last good configuration serves …
    assert post(url, headers={"x-api-key": keys["spare"][0]})[0] == 401  # … with what it had revoked
    # the store comes back as an older copy (spare still in it) and moves on past the edge's version
    store_path.unlink()
    shutil.copy(older, store_path)
    store_path.with_name(f"{store_path.name}.head").unlink()  # restored from a backup on purpose (keel/chain.py)
    with PolicyStore(store_path) as store:
        old_keys = tuple(s for _, s in keys.values())
        for n in range(2):
            store.apply(
                {"ops": ("tenant", Tenant("ops", old_keys).as_body())}, author="tests", reason=f"restored {n}"
            )
        restored = store.version()
    assert restored > 2
    tend_until(f, messages, lambda: f.version == restored, "the restored store's version")
    assert post(url, headers={"x-api-key": keys["spare"][0]})[0] == 401  # revoked in a version seen: for good
    assert post(url, headers={"x-api-key": keys["kept"][0]})[0] == 200
    with IncidentLog(incidents) as log:
        assert not log.get(f.outage_key()).open  # recovered at the first read
    assert any("reads the policy store again" in m for m in messages)
