"""Tenants that authenticate (keel/tenants.py, `keel tenant`): a key shown once and stored only as a salted hash in
the hash-chained policy store; the tenant comes from the key; rotated and revoked keys stop working; a tenant claims
only the tiers and risk levels it was given."""

from __future__ import annotations

import pytest

from keel.cli import main
from keel.policies import PolicyStore
from keel.policies.errors import PolicyValidationError
from keel.tenants import Tenant, authenticate, body_problems, new_key, parse_key


def test_a_key_is_stored_as_a_salted_hash_and_authenticates_only_its_tenant():
    key, stored = new_key("2013-04-01T00:00:00+00:00")
    key_id, secret = parse_key(key)
    assert key_id == stored.key_id and secret not in str(stored.as_body())  # the secret is never stored
    ops = Tenant("ops", (stored,))
    other_key, other_stored = new_key("2013-04-01T00:00:00+00:00")
    tenants = {"ops": ops, "pricing": Tenant("pricing", (other_stored,))}
    assert authenticate(tenants, key) is ops and authenticate(tenants, other_key).name == "pricing"
    forged = f"keel_{key_id}_{'A' * 43}"  # the right key id, another secret
    for bad in (forged, "", "keel_zz_short", key + "x", key.upper()):
        assert authenticate(tenants, bad) is None, bad
    same_secret = Tenant("ops", (stored,)).as_body()["keys"][0]
    assert same_secret["salt"] != other_stored.salt  # a salt per key: equal secrets would not hash equal


def test_a_tenant_claims_only_what_it_was_given():
    _, stored = new_key("2013-04-01T00:00:00+00:00")
    basic = Tenant("basic", (stored,))  # the defaults: L2, L3 and risk levels 2, 3
    assert basic.may_claim("L2", 2) is None
    assert basic.may_claim("L1", 2) == "tenant basic may use tiers L2, L3, not L1"
    assert basic.may_claim("L2", 1) == "tenant basic may use risk levels 2, 3, not 1"
    assert Tenant("ops", (stored,), tiers=("L1", "L2"), risk_levels=(1,)).may_claim("L1", 1) is None


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        ({"keys": [{"id": "abc", "salt": "0" * 32, "sha256": "0" * 64, "created": "x"}]}, "key_id"),
        ({"keys": [{"id": "a" * 12, "secret": "s"}]}, "key_shape"),  # a secret never goes in the store
        ({"tiers": ["L0"]}, "tiers"),
        ({"risk_levels": [True]}, "risk_levels"),
        ({"quota_share": 0}, "quota_share"),
        ({"owner": "x"}, "known_fields"),
    ],
)
def test_the_store_refuses_a_malformed_tenant_naming_the_rule(tmp_path, body, rule):
    assert body_problems("ops", body)[0].startswith(f"{rule}:")
    with PolicyStore(tmp_path / "p.sqlite") as store, pytest.raises(PolicyValidationError) as exc:
        store.apply({"ops": ("tenant", body)}, author="t", reason="t")
    assert exc.value.rule == rule


def test_keel_tenant_add_list_rotate_revoke(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    assert main(["tenant", "add", "ops", "--tiers", "L1,L2", "--risk-levels", "1,2", "--reason", "dashboards"]) == 0
    first = capsys.readouterr().out.strip()  # the key alone on stdout
    assert main(["tenant", "add", "ops", "--reason", "again"]) == 2
    assert "tenant ops exists" in capsys.readouterr().err
    assert main(["tenant", "rotate", "ops", "--reason", "quarterly"]) == 0
    second = capsys.readouterr().out.strip()
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        tenants = {p.name: Tenant.from_body(p.name, p.body) for p in store.state().values() if p.type == "tenant"}
        log = store.log()
    assert authenticate(tenants, first) is None and authenticate(tenants, second).name == "ops"  # rotated out
    assert tenants["ops"].tiers == ("L1", "L2") and [c.reason for c in log] == ["dashboards", "quarterly"]
    raw = (tmp_path / "policies.sqlite").read_bytes()
    assert parse_key(first)[1].encode() not in raw and parse_key(second)[1].encode() not in raw
    assert main(["tenant", "revoke", "ops", "--key", "0" * 12, "--reason", "x"]) == 2
    assert "holds no key 000000000000" in capsys.readouterr().err
    assert main(["tenant", "revoke", "ops", "--reason", "laptop lost"]) == 0
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        revoked = Tenant.from_body("ops", store.get("ops").body)
    assert revoked.keys == () and not revoked.authenticates(second)
    capsys.readouterr()
    assert main(["tenant", "list"]) == 0
    assert "ops: tiers L1,L2; risk levels 1,2; quota share 1; keys none: every key revoked" in capsys.readouterr().out
    assert main(["tenant", "rotate", "nobody", "--reason", "x"]) == 2


def test_each_live_replay_run_takes_a_fresh_key_of_its_own_tenant(tmp_path):
    from keel.tenants import REPLAY_TENANT, issue_replay_key

    with PolicyStore(tmp_path / "p.sqlite") as store:
        first = issue_replay_key(store, "2013-04-01T12:00:00+00:00")
        second = issue_replay_key(store, "2013-04-01T12:05:00+00:00")
        replay = Tenant.from_body(REPLAY_TENANT, store.get(REPLAY_TENANT).body)
        reasons = [c.reason for c in store.log()]
    assert replay.authenticates(second) and not replay.authenticates(first)  # the last run's key stops working
    assert replay.tiers == ("L1", "L2", "L3") and replay.risk_levels == (1, 2, 3)
    assert reasons == ["the live replay's key for this run", "the live replay's key for this run (rotated)"]
