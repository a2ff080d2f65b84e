"""Probes against the real gateway (HTTP, with Triton behind it): every input bounded, every error structured and
logged with its request id, no record lost silently when the exposure log cannot be written."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from keel.exposure_log import read_exposures, scan_exposures
from tests import REPO
from tests.serving.conftest import request_body, serving_version_1

POLICY = {"version": "limits-1", "tenant_rate_limits": {"ops": {"rps": 1000, "burst": 1000}}}


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    with serving_version_1(runtime_home, serving_models[0], POLICY) as rt:
        yield rt


@pytest.fixture(scope="module")
def good(serving_models):
    return request_body(serving_models[1].row(0, named=True))


def exposure_of(runtime, request_id):
    lines = [e for e in read_exposures(runtime.home / "serving" / "exposures") if e["request_id"] == request_id]
    assert len(lines) == 1, f"{len(lines)} exposure lines for {request_id}"
    return lines[0]


def test_an_impossible_calendar_date_is_the_callers_error_naming_the_field(runtime, good):
    resp = runtime.post(good | {"flight": good["flight"] | {"month": 2, "day": 31}})
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_input"
    [violation] = err["violations"]
    # the day does not exist, so no time_hour can be that scheduled hour either
    assert violation["field"] == "day" and violation["rules"] == ["time_hour_is_the_scheduled_hour", "calendar_date"]
    assert "2013-02" in violation["message"]
    # each rule's reason beside its id (issue 49: a 422 named the rules but not why)
    assert violation["reasons"][0].startswith("time_hour in America/New_York disagrees with")
    assert violation["reasons"][1] == violation["message"]


def test_header_bytes_that_are_not_utf8_are_a_400(runtime, good):
    resp = httpx.post(
        f"{runtime.url}/v1/predict", content=json.dumps(good).encode(),
        headers=[(b"content-type", b"application/json"), (b"x-experiment-id", b"\xff\xfeexp")], timeout=10,
    )  # fmt: skip
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "bad_header" and resp.json()["error"]["header"] == "x-experiment-id"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"unit_id": "u" * 900_000}, "unit_id"),
        ({"unit_id": "a b"}, "unit_id"),
        ({"tenant_id": 'ops"\nkeel_gateway_requests_total{x="1"} 1e9'}, "tenant_id"),
        ({"tenant_id": ["ops"]}, "tenant_id"),
        ({"tenant_id": "ops.team"}, "tenant_id"),  # tenant ids have no '.', '/' or ':' (keel.names.TENANT_ID)
        ({"tenant_id": "../../etc"}, "tenant_id"),
        ({"tenant_id": "a:b"}, "tenant_id"),
    ],
)
def test_identifiers_are_bounded_and_of_a_safe_alphabet(runtime, good, change, field):
    resp = runtime.post(good | change)
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["error"]["code"] == "invalid_input" and body["error"]["field"] == field
    line = exposure_of(runtime, body["request_id"])
    assert line["status"] == 422 and "unit_id" not in line  # nothing of the bad value reaches the log
    assert len(json.dumps(line)) < 2000


@pytest.mark.parametrize("header", ["x-experiment-id", "x-request-id"])
def test_header_identifiers_are_bounded(runtime, good, header):
    resp = runtime.post(good, headers={header: "e" * 200})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["field"] == f"header {header}"


def test_a_body_over_the_limit_is_a_413_and_is_not_read(runtime, good):
    big = good | {"padding": "x" * (1 << 20)}
    resp = runtime.post(big)
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "body_too_large" and resp.json()["error"]["limit_bytes"] == 1 << 20
    assert runtime.post(good).status_code == 200  # the gateway is fine after it


def test_metrics_stay_one_line_per_sample_whatever_callers_send(runtime, good):
    for i in range(50):  # tenants nobody configured: their state is bounded, their label is "other"
        runtime.post(good | {"tenant_id": f"invented-{i}"})
    text = httpx.get(f"{runtime.url}/metrics", timeout=10).text
    for line in text.splitlines():
        assert line.startswith("#") or line.startswith("keel_"), line
    assert "invented-" not in text


def test_the_callers_request_id_is_used_echoed_and_logged_with_the_model_version(runtime, good):
    ok = runtime.post(good, headers={"x-request-id": "trace-4f2a:1"})
    assert ok.status_code == 200
    assert ok.json()["request_id"] == "trace-4f2a:1" and ok.headers["x-request-id"] == "trace-4f2a:1"
    assert exposure_of(runtime, "trace-4f2a:1")["model_version"] == 1
    bad = runtime.post(good | {"risk_level": 9}, headers={"x-request-id": "trace-4f2a:2"})
    assert bad.status_code == 422 and bad.headers["x-request-id"] == "trace-4f2a:2"
    line = exposure_of(runtime, "trace-4f2a:2")
    assert "model_version" in line and line["model_version"] is None and line["error"] == "invalid_risk_level"
    fresh = runtime.post({"nope": 1})  # no id given: a fresh one, still logged with a null model version
    line = exposure_of(runtime, fresh.json()["request_id"])
    assert line["model_version"] is None and fresh.headers["x-request-id"] == fresh.json()["request_id"]


def test_a_policy_store_that_went_backwards_is_refused_and_the_last_good_policy_stays(runtime, good):
    """The review's probe against the gateway: two commits, the newest deleted with the triggers dropped. The
    gateway keeps the version it applied, says so on /readyz and /metrics, and `keel policy verify` fails."""
    from keel.policies import PolicyStore

    store = PolicyStore(runtime.home / "policies.sqlite")
    limits = lambda rps: {"default": {"rps": 1000, "burst": 1000}, "tenants": {"tiny": {"rps": rps, "burst": 2}}}  # noqa: E731
    store.apply({"limits": ("rate_limit", limits(1000))}, author="ops", reason="generous")
    store.apply({"limits": ("rate_limit", limits(0.01))}, author="ops", reason="tight")
    applied = store.version()
    store.close()
    deadline = time.monotonic() + 30
    while httpx.get(f"{runtime.url}/readyz", timeout=5).json().get("policy_version") != applied:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    db = sqlite3.connect(runtime.home / "policies.sqlite")
    for trigger in ("commits_no_delete", "policy_versions_no_delete"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute("DELETE FROM commits WHERE version = ?", (applied,))
    db.execute("DELETE FROM policy_versions WHERE version = ?", (applied,))
    db.execute("DELETE FROM policy_checkpoints WHERE seq = ?", (applied,))
    db.commit()
    db.close()
    deadline = time.monotonic() + 30
    while "went back" not in str(httpx.get(f"{runtime.url}/readyz", timeout=5).json().get("policy_error")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ready = httpx.get(f"{runtime.url}/readyz", timeout=5).json()
    assert ready["policy_version"] == applied and f"from version {applied} to {applied - 1}" in ready["policy_error"]
    metrics = httpx.get(f"{runtime.url}/metrics", timeout=10).text
    assert "keel_gateway_policy_store_regressions_total 1" in metrics
    tiny = [runtime.post(good | {"tenant_id": "tiny"}).status_code for _ in range(4)]
    assert tiny == [200, 200, 429, 429]  # burst 2, then the tight limit of the version that was removed holds
    verify = subprocess.run([sys.executable, "-m", "keel.cli", "policy", "verify"], capture_output=True, text=True,
                            cwd=REPO, env=os.environ | {"KEEL_HOME": str(runtime.home)})  # fmt: skip
    assert verify.returncode == 1 and "truncated" in verify.stdout + verify.stderr


def test_a_full_disk_loses_records_visibly_never_answers(runtime, good):
    """The exposure log cannot grow (a file-size limit on the serving process, as a full disk would): answers are
    still served, every line on disk stays whole, and /metrics and /readyz count what was lost. Runs last here: the
    limit stays on the process."""
    today = runtime.home / "serving" / "exposures" / time.strftime("exposures-%Y%m%d.jsonl", time.gmtime())
    before = len(scan_exposures(runtime.home / "serving" / "exposures").records)
    limit = today.stat().st_size + 1500  # room for two or three more lines, then a short write, then EFBIG
    resource.prlimit(runtime.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
    answers = [runtime.post(good) for _ in range(20)]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    scan = scan_exposures(runtime.home / "serving" / "exposures")
    assert scan.skipped == 0  # no torn line: the short write was cut back
    written = len(scan.records) - before
    assert 0 < written < 20
    assert today.stat().st_size <= limit
    metrics = httpx.get(f"{runtime.url}/metrics", timeout=10).text
    [lost] = [ln for ln in metrics.splitlines() if ln.startswith("keel_gateway_exposure_write_failures_total")]
    assert float(lost.split()[-1]) == 20 - written
    ready = httpx.get(f"{runtime.url}/readyz", timeout=10).json()
    assert ready["exposure_log"]["ok"] is False and ready["exposure_log"]["lost_records"] == 20 - written
    assert (
        "File too large" in ready["exposure_log"]["last_error"]
        or "short write" in ready["exposure_log"]["last_error"]
    )
