"""The read-only follower of a policy store (the gateway's): one indexed query for "is there a newer version?",
and on Postgres a LISTEN connection that hears every commit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from keel.policies.records import Policy, notify_channel
from keel.sqldb import Database, Location, PgLocation, location_of
from keel.storage import Closing

STATE_SQL = (
    "SELECT p.name, p.type, p.body, p.version FROM policy_versions p "
    "JOIN (SELECT name, MAX(version) AS v FROM policy_versions WHERE version <= ? GROUP BY name) latest "
    "ON p.name = latest.name AND p.version = latest.v ORDER BY p.name"
)


class PolicyReader(Closing):
    """A read-only view of a policy store for the processes that follow it (the gateway): it never writes, never
    creates the store, and answers "is there a newer version?" with one indexed query.

    On Postgres it can also *listen*: ``listen()`` opens a second connection that LISTENs on the store's channel
    (every commit notifies its version when it commits) and returns its file descriptor; the follower waits on it
    and calls ``notified()``. When that connection drops, ``notified()`` says so (``listening`` is False) and the
    follower polls ``version()`` until ``listen()`` succeeds again."""

    def __init__(self, location: str | Path | Location):
        self.location = location_of(location)
        self.path = self.location
        self._db = None
        self._listener = None

    @property
    def postgres(self) -> bool:
        return isinstance(self.location, PgLocation)

    def _conn(self):
        if self._db is None:
            if self.postgres:
                self._db = Database.open(self.location, create=False)
            else:
                if not self.location.exists():
                    return None
                self._db = sqlite3.connect(
                    f"file:{self.location}?mode=ro", uri=True, isolation_level=None, timeout=1.0
                )
        return self._db

    def _query(self, sql: str, params: tuple = ()) -> list:
        db = self._conn()
        if db is None:
            return []
        try:
            return db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # not initialised yet
                return []
            raise
        except Exception as exc:
            if self.postgres:  # the connection broke (server restarted): reconnect on the next call
                self._drop()
                if type(exc).__name__ == "UndefinedTable":
                    return []
            raise

    def version(self) -> int:
        rows = self._query("SELECT MAX(version) FROM commits")
        return int(rows[0][0] or 0) if rows else 0

    def state(self, version: int) -> dict[str, Policy]:
        rows = self._query(STATE_SQL, (version,))
        return {r[0]: Policy(r[0], r[1], json.loads(r[2]), r[3]) for r in rows}

    # -- following a Postgres store by notification --

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def listen(self) -> int | None:
        """Start listening for commits (Postgres only): the descriptor to wait on, or None (SQLite, or the server
        cannot be reached — poll meanwhile)."""
        if not self.postgres:
            return None
        if self._listener is None:
            try:
                import psycopg2

                conn = psycopg2.connect(self.location.url, connect_timeout=5, application_name="keel-listen")
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute(f"LISTEN {notify_channel(self.location)}")
                self._listener = conn
            except Exception:  # noqa: BLE001 - no server now: the caller polls and tries again later
                self._listener = None
                return None
        return self._listener.fileno()

    def notified(self) -> bool:
        """After the descriptor became readable: whether a commit was announced. A dropped connection also answers
        True (look now: something may have been missed) and stops listening."""
        if self._listener is None:
            return False
        try:
            self._listener.poll()
        except Exception:  # noqa: BLE001 - the server went away: back to polling
            self._close_listener()
            return True
        got = bool(self._listener.notifies)
        self._listener.notifies.clear()
        return got

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._listener = None

    def _drop(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._db = None

    def close(self) -> None:
        self._drop()
        self._close_listener()
