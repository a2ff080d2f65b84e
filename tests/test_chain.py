"""The hash chain with keyed checkpoints (keel.chain) behind both append-only logs, probed on each control-plane
backend (a real SQLite file, a schema of the real Postgres server) the way someone with write access to it would:
take the triggers away, delete the newest entries, rewrite an entry and recompute every hash after it, append rows
without the key."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from keel.chain import ChainKeyError, ChainTruncatedError, key_path
from keel.ledger import Ledger, entry_hash
from keel.policies import PolicyStore, commit_hash
from tests import REPO
from tests.control_plane import TEST_KEY, Raw, env_for, fresh_location, url_of

LIMIT = {"default": {"rps": 100, "burst": 200}}


class PolicyLog:
    """The policy store seen as a chain: commits rate limits, tampers through raw SQL."""

    table, seq_col = "commits", "version"
    tables = ("commits", "policy_versions", "policy_checkpoints")

    def __init__(self, path):
        self.path = path
        self.store = PolicyStore(path)

    def append(self, i: int) -> None:
        self.store.apply({"limits": ("rate_limit", {"default": {"rps": 100 + i, "burst": 200}})}, author="ops",
                         reason=f"limit {i}")  # fmt: skip

    def verify(self):
        return self.store.verify()

    def rows(self, db):
        return db.execute("SELECT version, author, reason, committed_at, reverts, changes, prev_hash, hash FROM "
                          "commits ORDER BY version")  # fmt: skip

    def rehash(self, row, prev):
        v, author, reason, at, reverts, changes, _, _ = row
        return commit_hash(prev, v, author, reason, at, reverts, json.loads(changes))

    def set_row(self, db, row, prev, digest):
        db.execute("UPDATE commits SET reason = ?, prev_hash = ?, hash = ? WHERE version = ?",
                   (row[2], prev, digest, row[0]))  # fmt: skip

    def delete_newest(self, db):
        db.execute("DELETE FROM commits WHERE version = (SELECT MAX(version) FROM commits)")
        db.execute("DELETE FROM policy_versions WHERE version = (SELECT MAX(version) FROM policy_versions)")
        db.execute("DELETE FROM policy_checkpoints WHERE seq = (SELECT MAX(seq) FROM policy_checkpoints)")

    def edit(self, row):
        return (*row[:2], "rewritten reason", *row[3:])


class LedgerLog:
    table, seq_col, tables = "entries", "seq", ("entries", "ledger_checkpoints")

    def __init__(self, path):
        self.path = path
        self.store = Ledger(path)

    def append(self, i: int) -> None:
        self.store.append(f"rel-{i}", {"model": {"sha256": f"{i:064d}"}}, datetime(2013, 1, 1 + i, tzinfo=UTC))

    def verify(self):
        return self.store.verify()

    def rows(self, db):
        return db.execute("SELECT seq, release_id, live_from, manifest, reverts, prev_hash, hash FROM entries "
                          "ORDER BY seq")  # fmt: skip

    def rehash(self, row, prev):
        seq, release_id, live_from, manifest, reverts, _, _ = row
        return entry_hash(prev, seq, release_id, live_from, manifest, reverts)

    def set_row(self, db, row, prev, digest):
        db.execute("UPDATE entries SET release_id = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                   (row[1], prev, digest, row[0]))  # fmt: skip

    def delete_newest(self, db):
        db.execute("DELETE FROM entries WHERE seq = (SELECT MAX(seq) FROM entries)")
        db.execute("DELETE FROM ledger_checkpoints WHERE seq = (SELECT MAX(seq) FROM ledger_checkpoints)")

    def edit(self, row):
        return (row[0], "rel-forged", *row[2:])


@pytest.fixture(params=[PolicyLog, LedgerLog], ids=["policy store", "release ledger"])
def log(request, location, backend, monkeypatch):
    if backend == "sqlite":
        monkeypatch.delenv("KEEL_CHAIN_KEY", raising=False)  # the key file beside the database
    chain = request.param(location)
    for i in range(1, 4):
        chain.append(i)
    assert chain.verify().ok, chain.verify().problems
    yield chain
    chain.store.close()


def tamper(log) -> Raw:
    return Raw(log.path).without_triggers(*log.tables)


def test_removing_the_newest_entries_is_detected_and_blocks_appends(log):
    """The probe from review: the newest entry deleted with the triggers dropped. The rest still chains, but the
    published checkpoint says the log went further — and keel appends nothing on top of the hole."""
    db = tamper(log)
    log.delete_newest(db)
    db.close()
    result = log.verify()
    assert not result.ok
    assert any("entries 3…3 were removed (truncated)" in p for p in result.problems), result.problems
    with pytest.raises(ChainTruncatedError, match="its newest entries were removed"):
        log.append(9)


def test_rolling_back_the_database_with_its_head_is_detected_from_the_journal(log, backend):
    """The hostile probe: the database and its published head restored from a copy taken before the newest entry
    (the newest entry and its head gone together, consistently). The rest chains, the head matches it — but the
    journal still holds the newer entry, checkpointed with the key, and verify says so."""
    chain = "policy" if isinstance(log, PolicyLog) else "ledger"
    if backend == "sqlite":
        files = [Path(f"{log.path}{suffix}") for suffix in ("", "-wal", "-shm", ".head")]
        log.store.close()
        saved = {f: f.read_bytes() for f in files if f.exists()}
        log.store = type(log.store)(log.path)
        log.append(4)
        assert log.verify().ok
        log.store.close()
        for f in files:
            f.unlink(missing_ok=True)
        for f, data in saved.items():
            f.write_bytes(data)
        log.store = type(log.store)(log.path)
    else:
        log.append(4)
        db = tamper(log)
        log.delete_newest(db)
        db.execute(f"DELETE FROM {log.path.witness_schema}.{chain}_published WHERE seq = 4")
        db.close()
    result = log.verify()
    assert not result.ok, "a rolled-back store passed verify"
    assert any("entries 4…4 were rolled back" in p for p in result.problems), result.problems


def test_a_head_seen_off_the_machine_must_be_in_the_log(log):
    """``verify(known_head)``: the head an alert carried (keel.alerts' witness) — still there passes; past the end
    (rolled back) or another hash (rewritten) does not."""
    db = Raw(log.path)
    newest, links_hash = log.rows(db)[-1][0], log.rows(db)[-1][-1]
    db.close()
    assert log.store.verify((newest, links_hash[:12])).ok
    ahead = log.store.verify((newest + 2, "ab" * 32))
    assert not ahead.ok and any(f"the log ends at {'version' if isinstance(log, PolicyLog) else 'entry'} {newest}"
                                in p for p in ahead.problems), ahead.problems  # fmt: skip
    other = log.store.verify((newest, "0" * 64))
    assert not other.ok and any("is not the one a witness saw" in p for p in other.problems)


def test_a_recomputed_chain_is_detected(log):
    """Rewrite the first entry and recompute every hash after it: the chain is self-consistent again, but no
    checkpoint made with the key matches it."""
    db = tamper(log)
    rows = log.rows(db)
    prev = "0" * 64
    for i, row in enumerate(rows):
        row = log.edit(row) if i == 0 else row
        digest = log.rehash(row, prev)
        log.set_row(db, row, prev, digest)
        prev = digest
    db.close()
    result = log.verify()
    assert not result.ok
    assert any("does not match its checkpoint (the chain was rewritten)" in p for p in result.problems)
    assert not any("content does not match its hash" in p for p in result.problems)  # the chain itself is whole


def test_an_entry_appended_without_the_key_is_detected(log):
    db = Raw(log.path)
    rows = log.rows(db)
    last = rows[-1]
    forged = (last[0] + 1, *log.edit(last)[1:])
    digest = log.rehash(forged, last[-1])
    cols = ",".join("?" * len(forged))
    db.execute(f"INSERT INTO {log.table} VALUES ({cols})", (*forged[:-2], last[-1], digest))
    db.close()
    result = log.verify()
    assert not result.ok and any(f"entry {last[0] + 1} has no checkpoint" in p for p in result.problems)


def test_the_cli_verify_exits_1_on_a_truncated_policy_store(tmp_path, monkeypatch, backend):
    with fresh_location(backend, tmp_path, "policies") as location:
        verify_truncated_from_the_cli(tmp_path, monkeypatch, location)


def verify_truncated_from_the_cli(tmp_path, monkeypatch, location):
    if isinstance(location, Path):
        monkeypatch.delenv("KEEL_CHAIN_KEY", raising=False)
    log = PolicyLog(location)
    log.append(1)
    log.append(2)
    db = tamper(log)
    log.delete_newest(db)
    db.close()
    log.store.close()
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CHAIN_KEY"} | {"KEEL_HOME": str(tmp_path)}
    if not isinstance(location, Path):  # the one setting: the CLI finds the control plane on Postgres
        env |= {"KEEL_CONTROL_PLANE": url_of(location), **env_for(location)}
    out = subprocess.run([sys.executable, "-m", "keel.cli", "policy", "verify"], capture_output=True, text=True,
                         cwd=REPO, env=env)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "truncated" in out.stdout + out.stderr


def test_a_postgres_control_plane_needs_the_key_from_the_environment(tmp_path, monkeypatch):
    """Writers on several machines share no key file: without $KEEL_CHAIN_KEY a Postgres store refuses to open, and
    says why; a store opened with another key finds every checkpoint foreign."""
    monkeypatch.setenv("KEEL_CHAIN_KEY", TEST_KEY)
    with fresh_location("postgres", tmp_path) as location:
        with Ledger(location) as ledger:
            ledger.append("rel-1", {})
        monkeypatch.delenv("KEEL_CHAIN_KEY")
        with pytest.raises(ChainKeyError, match="needs \\$KEEL_CHAIN_KEY"):
            Ledger(location)
        monkeypatch.setenv("KEEL_CHAIN_KEY", "another key")
        with Ledger(location) as ledger:
            result = ledger.verify()
        assert not result.ok and any("not made with this store's key" in p for p in result.problems)


def test_the_key_lives_outside_the_database_owner_only(tmp_path, monkeypatch):
    monkeypatch.delenv("KEEL_CHAIN_KEY", raising=False)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.append("rel-1", {})
    key = key_path(tmp_path / "ledger.sqlite")
    assert key.exists() and key.stat().st_mode & 0o777 == 0o600
    assert key.read_text() not in (tmp_path / "ledger.sqlite").read_bytes().decode("latin-1")
    ledger.close()
    key.chmod(0o644)
    with pytest.raises(ChainKeyError, match="readable by its owner only"):
        Ledger(tmp_path / "ledger.sqlite")
    key.chmod(0o600)
    # A different key (from the environment) does not vouch for this log's checkpoints.
    monkeypatch.setenv("KEEL_CHAIN_KEY", "another key")
    result = Ledger(tmp_path / "ledger.sqlite").verify()
    assert not result.ok and any("not made with this store's key" in p for p in result.problems)


def test_a_log_from_before_checkpoints_is_adopted_once(tmp_path, monkeypatch):
    monkeypatch.delenv("KEEL_CHAIN_KEY", raising=False)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.append("rel-1", {})
    ledger.append("rel-2", {})
    ledger.close()
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("DROP TABLE ledger_checkpoints")  # as a ledger written by keel before checkpoints looks
    db.commit()
    db.close()
    (tmp_path / "ledger.sqlite.head").unlink()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.verify().ok
    ledger.append("rel-3", {})
    assert ledger.verify().ok and ledger.verify().entries == 3
