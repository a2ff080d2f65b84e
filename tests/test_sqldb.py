"""keel.sqldb on both control-plane backends: a write that fails — a refused commit, an SQL error — ends its
transaction, so the connection stays usable and other writers are not left waiting on its lock.

(The Postgres connections are in autocommit mode with explicit BEGIN/COMMIT, where psycopg2's ``rollback()`` does
nothing: the transaction has to be ended with a ROLLBACK statement.)"""

from __future__ import annotations

import sqlite3

import pytest

from keel.policies import PolicyError, PolicyStore, PolicyValidationError
from keel.sqldb import Database, PgLocation
from tests.control_plane import Raw
from tests.policy.test_store import BREAKER, T0


def other_writer_takes_the_lock(location, table: str) -> None:
    """Another connection takes ``table``'s writer lock, giving up after 10 s (raises) instead of hanging."""
    if isinstance(location, PgLocation):
        raw = Raw(location)
        try:
            raw.execute("SET lock_timeout = '10s'")
            raw.execute(f"BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE; ROLLBACK")
        finally:
            raw.close()
    else:
        conn = sqlite3.connect(location, timeout=10, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()


def test_a_refused_commit_leaves_the_store_usable_and_the_log_unlocked(location):
    with PolicyStore(location) as store:
        store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="a", reason="v1", at=T0)
        with pytest.raises(PolicyError, match="version conflict"):
            store.apply({"breaker": ("circuit_breaker", BREAKER)}, author="b", reason="stale", expected_version=7)
        with pytest.raises(PolicyValidationError, match="type_fixed"):
            store.apply({"breaker": ("rate_limit", {"default": {"rps": 1, "burst": 1}})}, author="b", reason="r")
        other_writer_takes_the_lock(location, "commits")  # the refused commits hold no lock
        # another process commits, and this store — a long-lived one, like a sensor's — sees it and commits after it
        with PolicyStore(location) as other:
            other.apply({"breaker": ("circuit_breaker", BREAKER | {"open_s": 5})}, author="c", reason="v2")
        assert store.version() == 2 and store.get("breaker").body["open_s"] == 5
        store.apply({"breaker": ("circuit_breaker", BREAKER | {"open_s": 9})}, author="a", reason="v3")
    with PolicyStore(location) as reopened:  # durable: committed, not left in an open transaction
        assert reopened.version() == 3 and reopened.verify().ok


def test_an_sql_error_inside_a_write_ends_the_transaction(location):
    db = Database.open(location)
    try:
        db.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
        with pytest.raises(Exception, match="no_such_table|no such table|does not exist"):
            with db.write(lock="t"):
                db.execute("INSERT INTO t (x) VALUES (1)")
                db.execute("INSERT INTO no_such_table (x) VALUES (1)")
        assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 0  # rolled back, and the connection answers
        other_writer_takes_the_lock(location, "t")
        with db.write(lock="t"):
            db.execute("INSERT INTO t (x) VALUES (2)")
    finally:
        db.close()
    reopened = Database.open(location)
    try:
        assert [r[0] for r in reopened.execute("SELECT x FROM t").fetchall()] == [2]
    finally:
        reopened.close()
