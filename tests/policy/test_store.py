"""The policy store: validation per type, versions, point-in-time reads, diffs, reverts, an append-only log."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from keel.policies import PolicyError, PolicyStore, PolicyValidationError, validate_policy
from tests.control_plane import TEST_KEY, Raw, env_for, fresh_location, url_of

T0 = datetime(2013, 6, 1, 12, 0, tzinfo=UTC)
AB = {
    "model": "flight-delay",
    "variants": [
        {"name": "champion", "version": 1, "weight": 0.9},
        {"name": "challenger", "version": 2, "weight": 0.1},
    ],
}
BREAKER = {"error_rate": 0.05, "window_s": 5, "min_requests": 20, "open_s": 30, "half_open_probes": 5}
CANARY = {
    "model": "flight-delay",
    "champion_version": 1,
    "challenger_version": 2,
    "steps": [1, 10, 30, 50, 100],
    "interval_s": 60,
    "min_samples": 200,
    "error_ratio": 1.2,
    "alpha": 0.05,
}


@pytest.fixture
def store(location):
    """A policy store on each backend (tests/control_plane.py): a SQLite file, a Postgres schema."""
    s = PolicyStore(location, versions_of=lambda model: {1, 2, 3})
    yield s
    s.close()


@pytest.mark.parametrize(
    "type_, body, rule",
    [
        (
            "ab_test",
            AB | {"variants": [AB["variants"][0] | {"weight": 0.9}, AB["variants"][1] | {"weight": 0.2}]},
            "weights_sum_to_1",
        ),
        (
            "ab_test",
            AB | {"variants": [AB["variants"][0] | {"weight": 0.3 + 1e-8}, AB["variants"][1] | {"weight": 0.7}]},
            "weights_sum_to_1",
        ),
        (
            "ab_test",
            AB | {"variants": [AB["variants"][0] | {"version": 9, "weight": 1.0}]},
            "model_version_registered",
        ),
        ("ab_test", AB | {"variants": [AB["variants"][0], AB["variants"][0]]}, "variant_names_unique"),
        ("canary", CANARY | {"steps": [1, 30, 10, 100]}, "steps_increasing"),
        ("canary", CANARY | {"steps": [1, 10, 50]}, "steps_end_at_100"),
        ("canary", CANARY | {"steps": [0, 100]}, "steps_percentages"),
        ("canary", CANARY | {"challenger_version": 1}, "distinct_versions"),
        ("canary", CANARY | {"interval_s": 0}, "interval_range"),
        ("canary", CANARY | {"on_breach": "ignore"}, "on_breach"),
        ("canary", CANARY | {"latency_ratio": 0.5}, "latency_ratio_range"),
        ("circuit_breaker", BREAKER | {"error_rate": 1.5}, "error_rate_range"),
        ("circuit_breaker", BREAKER | {"min_requests": 2.5}, "min_requests_integer"),
        ("circuit_breaker", {k: v for k, v in BREAKER.items() if k != "open_s"}, "open_present"),
        ("rate_limit", {"default": {"rps": 0, "burst": 5}}, "rps_range"),
        ("feature_freeze", {"features": {"wind_speed": {"frozen": True}}}, "known_type"),  # retired
        (
            "sla_tier",
            {"tiers": {"L1": {"p99_ms": 15, "availability": 0.999, "timeout_ms": 100}}, "models": {"m": "L9"}},
            "tier_known",
        ),
        (
            "sla_tier",
            {
                "tiers": {"L1": {"p99_ms": 15, "availability": 0.999, "timeout_ms": 100}},
                "admit_in_flight": {"L1": -1},
            },
            "admission_range",
        ),
        (
            "sla_tier",
            {"tiers": {"L1": {"p99_ms": 15, "availability": 0.999, "timeout_ms": 100}}, "admit_wait_ms": {"L9": 5}},
            "tier_known",
        ),
        ("nonsense", {}, "known_type"),
        ("circuit_breaker", BREAKER | {"colour": "red"}, "known_fields"),
    ],
)
def test_each_rule_is_named_when_broken(type_, body, rule):
    with pytest.raises(PolicyValidationError) as err:
        validate_policy("p", type_, body, versions_of=lambda model: {1, 2, 3})
    assert err.value.rule == rule, str(err.value)


def test_weights_within_1e9_pass():
    body = AB | {"variants": [AB["variants"][0] | {"weight": 0.1 + 0.2}, AB["variants"][1] | {"weight": 0.7}]}
    validate_policy("p", "ab_test", body)  # 0.30000000000000004 + 0.7: within 1e-9 of 1


def test_versions_are_gap_free_and_state_is_per_version(store):
    c1 = store.apply(
        {"routing": ("ab_test", AB), "breaker": ("circuit_breaker", BREAKER)}, author="a", reason="r", at=T0
    )
    c2 = store.apply(
        {"breaker": ("circuit_breaker", BREAKER | {"open_s": 10})},
        author="b",
        reason="shorter",
        at=T0 + timedelta(hours=1),
    )
    assert (c1.version, c2.version) == (1, 2) and store.version() == 2
    assert store.state(1)["breaker"].body["open_s"] == 30 and store.state(2)["breaker"].body["open_s"] == 10
    assert store.state(2)["routing"].version == 1  # unchanged policies carry over
    with pytest.raises(PolicyError, match="version conflict"):
        store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="c", reason="stale", expected_version=2)
    with pytest.raises(PolicyValidationError, match="type_fixed"):
        store.apply({"breaker": ("rate_limit", {"default": {"rps": 1, "burst": 1}})}, author="c", reason="r")
    assert store.version() == 2  # refused commits leave no trace


def test_point_in_time_exactly_on_boundaries(store):
    store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="v1", at=T0)
    store.apply(
        {"breaker": ("circuit_breaker", BREAKER | {"open_s": 10})},
        author="a",
        reason="v2",
        at=T0 + timedelta(hours=1),
    )
    assert store.at(T0 - timedelta(microseconds=1)) == (0, {})
    assert store.at(T0)[0] == 1
    assert store.at(T0 + timedelta(hours=1) - timedelta(microseconds=1))[0] == 1
    v, state = store.at(T0 + timedelta(hours=1))
    assert v == 2 and state["breaker"].body["open_s"] == 10


def test_diff_and_revert_is_a_new_commit(store):
    store.apply({"routing": ("ab_test", AB)}, author="a", reason="start", at=T0)
    shifted = AB | {"variants": [AB["variants"][0] | {"weight": 0.5}, AB["variants"][1] | {"weight": 0.5}]}
    store.apply(
        {"routing": ("ab_test", shifted), "breaker": ("circuit_breaker", BREAKER)}, author="a", reason="50/50"
    )
    diff = store.diff(1, 2)
    assert set(diff) == {"routing", "breaker"} and diff["breaker"][0] is None
    with pytest.raises(PolicyError, match="did not exist then"):
        store.revert(1, author="ops", reason="undo")  # breaker did not exist at 1: policies are never deleted
    store.apply({"breaker": ("circuit_breaker", BREAKER | {"open_s": 5})}, author="a", reason="tune")
    c = store.revert(2, author="ops", reason="undo the tune")
    assert c.version == 4 and c.reverts == 2 and store.state(4)["breaker"].body == BREAKER
    assert [x.version for x in store.log()] == [1, 2, 3, 4] and store.verify().ok


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE commits SET reason = 'x'",
        "DELETE FROM commits WHERE version = 1",
        "UPDATE policy_versions SET body = '{}'",
        "DELETE FROM policy_versions",
    ],
)
def test_updates_and_deletes_are_refused_by_triggers(store, sql):
    store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="r")
    db = Raw(store.location)
    with pytest.raises(db.refused, match="append-only"):
        db.execute(sql)
    assert db.execute("SELECT COUNT(*) FROM commits") == [(1,)]
    db.close()


def test_truncate_is_refused_on_postgres(tmp_path, monkeypatch):
    """Row triggers do not see TRUNCATE (SQLite has none): on Postgres a statement trigger refuses it too."""
    monkeypatch.setenv("KEEL_CHAIN_KEY", TEST_KEY)
    with fresh_location("postgres", tmp_path) as loc, PolicyStore(loc) as store:
        store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="r")
        db = Raw(loc)
        for table in ("commits", "policy_versions"):
            with pytest.raises(db.refused, match="append-only: TRUNCATE refused"):
                db.execute(f"TRUNCATE {table}")
        assert db.execute("SELECT COUNT(*) FROM policy_versions") == [(1,)]
        db.close()


def test_verify_finds_an_edit_behind_the_triggers(store):
    store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="r")
    store.apply({"breaker": ("circuit_breaker", BREAKER | {"open_s": 1})}, author="a", reason="r")
    db = Raw(store.location).without_triggers("commits")
    db.execute("UPDATE commits SET reason = 'innocent' WHERE version = 1")
    db.close()
    with PolicyStore(store.location) as again:
        result = again.verify()
    assert not result.ok and any("version 1" in p and "edited" in p for p in result.problems)


def keel(*args, home, location=None):
    """The CLI in a subprocess on ``home``; with a Postgres ``location``, the control plane there
    ($KEEL_CONTROL_PLANE, the one setting)."""
    import os

    env = os.environ | {"KEEL_HOME": str(home)}
    if location is not None and not isinstance(location, Path):
        env |= {"KEEL_CONTROL_PLANE": url_of(location), **env_for(location)}
    return subprocess.run([sys.executable, "-m", "keel.cli", *args], capture_output=True, text=True, env=env)


def test_cli_commit_show_diff_revert_at(tmp_path, location):
    home = tmp_path / "home"
    good = tmp_path / "breaker.yaml"
    good.write_text(
        "policies:\n  - name: breaker\n    type: circuit_breaker\n    body: {error_rate: 0.05, window_s: 5, "
        "min_requests: 20, open_s: 30, half_open_probes: 5}\n"
    )
    assert keel("policy", "commit", str(good), "--reason", "first", home=home, location=location).returncode == 0
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(good.read_text().replace("open_s: 30", "open_s: 10") + "version: 2\n")
    out = keel("policy", "commit", str(tuned), "--reason", "faster recovery", home=home, location=location)
    assert out.returncode == 0 and "version 2" in out.stdout
    stale = keel(
        "policy", "commit", str(tuned), "--reason", "again", home=home, location=location
    )  # written for version 2
    assert stale.returncode == 2 and "version conflict" in stale.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("error_rate: 0.05", "error_rate: 5"))
    refused = keel("policy", "commit", str(bad), "--reason", "oops", home=home, location=location)
    assert refused.returncode == 2 and "rule error_rate_range" in refused.stderr
    show = keel("policy", "show", home=home, location=location)
    assert show.returncode == 0 and '"open_s": 10' in show.stdout
    diff = keel("policy", "diff", "1", "2", home=home, location=location)
    assert '"open_s": 30' in diff.stdout and '"open_s": 10' in diff.stdout
    revert = keel("policy", "revert", "1", "--reason", "too aggressive", home=home, location=location)
    assert revert.returncode == 0 and "version 3" in revert.stdout
    log = keel("policy", "log", home=home, location=location)
    assert "revert to 1" in log.stdout and log.stdout.count("#") == 3
    now = datetime.now(UTC).isoformat()
    at = keel("policy", "at", now, home=home, location=location)
    assert at.returncode == 0 and "policy version 3" in at.stdout and '"open_s": 30' in at.stdout
    assert keel("policy", "at", "2013-01-01T00:00:00Z", home=home, location=location).returncode == 1
    assert keel("policy", "verify", home=home, location=location).returncode == 0
    assert (home / "policies.sqlite").exists() == isinstance(location, Path)  # on Postgres: no file at all


def test_cli_show_says_when_a_body_is_not_the_one_its_commit_recorded(tmp_path, location):
    """A policy body edited in the table (its triggers dropped): `keel policy show` still prints what the table
    holds, and says on stderr that it is not what the commit recorded, with exit 1."""
    home = tmp_path / "home"
    spec = tmp_path / "limits.yaml"
    spec.write_text(
        "policies:\n  - name: limits\n    type: rate_limit\n    body: {default: {rps: 100, burst: 200}}\n"
    )
    assert keel("policy", "commit", str(spec), "--reason", "limits", home=home, location=location).returncode == 0
    clean = keel("policy", "show", home=home, location=location)
    assert clean.returncode == 0 and "WARNING" not in clean.stderr
    where = home / "policies.sqlite" if isinstance(location, Path) else location
    db = Raw(where).without_triggers("policy_versions")
    edited = '{"default": {"rps": 1e9, "burst": 1e9}}'
    db.execute("UPDATE policy_versions SET body = ? WHERE name = 'limits'", (edited,))
    db.close()
    show = keel("policy", "show", home=home, location=location)
    assert '"rps": 1000000000.0' in show.stdout  # what the table holds is shown…
    assert show.returncode == 1, show.stderr  # …and not trusted
    assert "limits: the policy table's body is not the one version 1 committed" in show.stderr
