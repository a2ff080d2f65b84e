"""A running gateway follows the policy store: committed policies take effect without a restart, a policy that
fails the gateway's own validation is refused and the last good one stays."""

from __future__ import annotations

import json
import sqlite3
import time

import httpx
import pytest

from keel.policies import PolicyStore, commit_hash
from keel.registry import ModelRegistry
from tests.serving.conftest import MODEL, Runtime, request_body, start_serve, stop_serve


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    proc, endpoints = start_serve(runtime_home)
    rt = Runtime(runtime_home, proc, endpoints, serving_models[0])
    try:
        rt.deployer().deploy(MODEL, [rt.target(1, "champion", 1.0), rt.target(2, "challenger", 0.0)])
        rt.wait_ready()
        yield rt
    finally:
        stop_serve(proc)


def store_of(rt: Runtime) -> PolicyStore:
    registry = ModelRegistry(rt.home / "registry")
    versions = set(registry.versions(MODEL))
    registry.close()
    return PolicyStore(rt.home / "policies.sqlite", versions_of=lambda model: versions)


def wait_for_policy(rt: Runtime, version: int, timeout: float = 5.0) -> float:
    started = time.monotonic()
    while True:
        ready = httpx.get(f"{rt.url}/readyz", timeout=5).json()
        if ready.get("policy_version") == version:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, ready
        time.sleep(0.02)


def test_committed_policies_take_effect_and_a_bad_one_is_refused(runtime, serving_models):
    _, feb = serving_models
    store = store_of(runtime)
    limits = {"default": {"rps": 500, "burst": 1000}, "tenants": {"slow": {"rps": 0.2, "burst": 1}}}
    store.apply({"limits": ("rate_limit", limits)}, author="ops", reason="throttle the slow tenant")
    pickup = wait_for_policy(runtime, 1)
    print(f"policy version 1 in force after {pickup:.3f} s")
    body = request_body(feb.row(0, named=True), tenant_id="slow")
    assert [runtime.post(body).status_code for _ in range(3)] == [200, 429, 429]

    units = [f"u{i}" for i in range(200)]
    assert {
        runtime.post(request_body(feb.row(1, named=True)) | {"unit_id": u}).json()["model_version"]
        for u in units[:40]
    } == {1}  # the deployment routes everything to the champion
    split = {
        "model": MODEL,
        "variants": [
            {"name": "champion", "version": 1, "weight": 0.5},
            {"name": "challenger", "version": 2, "weight": 0.5},
        ],
    }
    store.apply({"split": ("ab_test", split)}, author="ops", reason="50/50")
    wait_for_policy(runtime, 2)
    versions = [
        runtime.post(request_body(feb.row(1, named=True)) | {"unit_id": u}).json()["model_version"] for u in units
    ]
    assert 0.35 < versions.count(2) / len(versions) < 0.65

    # A writer that skipped validation appends a breaker with an error rate of 7 (hash chain intact): the gateway
    # validates again, refuses version 3, and keeps version 2 in force.
    last = store.log()[-1]
    changes = {
        "breaker": {
            "type": "circuit_breaker",
            "body": {"error_rate": 7, "window_s": 5, "min_requests": 20, "open_s": 30, "half_open_probes": 5},
        }
    }
    stamp = last.committed_at.isoformat()
    h = commit_hash(last.hash, 3, "rogue", "no checks", stamp, None, changes)
    db = sqlite3.connect(runtime.home / "policies.sqlite")
    db.execute(
        "INSERT INTO commits VALUES (3, 'rogue', 'no checks', ?, NULL, ?, ?, ?)",
        (stamp, json.dumps(changes, sort_keys=True), last.hash, h),
    )
    db.execute(
        "INSERT INTO policy_versions VALUES ('breaker', 3, 'circuit_breaker', ?)",
        (json.dumps(changes["breaker"]["body"]),),
    )
    db.commit()
    db.close()
    deadline = time.monotonic() + 5
    while "keel_gateway_policy_rejected_total" not in httpx.get(f"{runtime.url}/metrics", timeout=5).text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ready = httpx.get(f"{runtime.url}/readyz", timeout=5).json()
    assert ready["policy_version"] == 2 and "version 3 refused" in ready["policy_error"]
    assert "error_rate_range" in ready["policy_error"]
    again = [
        runtime.post(request_body(feb.row(1, named=True)) | {"unit_id": u}).json()["model_version"] for u in units
    ]
    assert again == versions  # the last good split still routes, unit by unit

    # A split that sends traffic to a version this gateway does not serve is valid but not applicable: it is not
    # applied (the deployment's weights stand, everything to the champion), readyz says why, and the moment the
    # version is deployed the same committed split takes effect — no new commit needed.
    store.apply(
        {
            "split": (
                "ab_test",
                split
                | {
                    "variants": [
                        {"name": "champion", "version": 1, "weight": 0.5},
                        {"name": "c3", "version": 3, "weight": 0.5},
                    ]
                },
            ),
            "breaker": (  # the rogue breaker replaced by a valid one
                "circuit_breaker",
                {"error_rate": 0.5, "window_s": 5, "min_requests": 20, "open_s": 30, "half_open_probes": 5},
            ),
        },
        author="ops",
        reason="mend the breaker; try model 3 before it is deployed",
    )
    wait_for_policy(runtime, 4)
    ready = httpx.get(f"{runtime.url}/readyz", timeout=5).json()
    assert ready["policy_error"] is None and "versions [3]" in ready["policy_notes"][0]
    routed = [
        runtime.post(request_body(feb.row(1, named=True)) | {"unit_id": u}).json()["model_version"] for u in units
    ]
    assert set(routed) == {1}
    runtime.deployer().deploy(
        MODEL,
        [runtime.target(1, "champion", 1.0), runtime.target(2, "challenger", 0.0), runtime.target(3, "c3", 0.0)],
    )
    deadline = time.monotonic() + 5
    while httpx.get(f"{runtime.url}/readyz", timeout=5).json()["policy_notes"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    routed = [
        runtime.post(request_body(feb.row(1, named=True)) | {"unit_id": u}).json()["model_version"] for u in units
    ]
    assert set(routed) == {1, 3} and 0.35 < routed.count(3) / len(routed) < 0.65
    store.close()
