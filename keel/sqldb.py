"""One connection to a control-plane database: an embedded SQLite file or a schema of a PostgreSQL server.

The control-plane stores (the policy store, the release ledger, the registry's metadata) keep the same tables, the
same values and the same guarantees on either; this module hides the few places where the two differ:

- **placeholders** (``?`` in the stores' SQL; ``%s`` for psycopg2);
- **write transactions that serialize writers**: SQLite's ``BEGIN IMMEDIATE``; on Postgres ``BEGIN`` and
  ``LOCK TABLE <log> IN EXCLUSIVE MODE`` (writers queue, readers never wait), so "next version = newest + 1" is
  gap-free under concurrent writers on any number of machines;
- **append-only enforcement**: triggers that refuse UPDATE and DELETE — and on Postgres also TRUNCATE, which row
  triggers do not see;
- **durability**: SQLite WAL with ``synchronous=FULL``; Postgres commits with its default ``synchronous_commit=on``
  (a commit that returned is in the WAL on disk);
- **where the chain's published head lives** (``keel.chain``): a file beside a SQLite database; for a Postgres
  schema ``S``, tables of a second schema ``S_witness`` — no filesystem is shared between machines, and a second
  schema can be given rights of its own (INSERT and SELECT only; see docs/stores.md).

A *location* is a ``Path`` (SQLite) or a ``PgLocation`` (a libpq URL and a schema). ``location_of`` reads one from
text: ``postgresql://user@host:5432/db?schema=keel`` (``schema`` defaults to ``keel``; passwords come from
``$PGPASSWORD`` or the URL, never from a file keel writes). ``control_plane`` is the one setting that moves a
deployment's control plane: ``$KEEL_CONTROL_PLANE`` unset or ``sqlite`` keeps the files under KEEL_HOME.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from keel.errors import KeelError
from keel.storage import Closing

CONTROL_PLANE_ENV = "KEEL_CONTROL_PLANE"
DEFAULT_SCHEMA = "keel"
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")
_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2")


class DatabaseError(KeelError):
    """A control-plane database cannot be reached or its location is not valid."""


@dataclass(frozen=True)
class PgLocation:
    """A schema of a PostgreSQL database: ``url`` is what libpq connects to (no ``schema`` in it)."""

    url: str
    schema: str = DEFAULT_SCHEMA
    table: str = ""  # the main table of the store this location was given for (what ``exists()`` looks for)

    @property
    def witness_schema(self) -> str:
        return f"{self.schema}_witness"

    def shown(self) -> str:
        """The location without its password, as logs, errors and the UI show it."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", "")) + f" (schema {self.schema})"

    def exists(self, table: str | None = None) -> bool:
        """Whether the schema holds ``table`` (default: this store's main table) — a store created there (the
        ``Path.exists()`` of a SQLite store)."""
        db = Database.open(self, create=False)
        try:
            return db.has_table(table or self.table)
        finally:
            db.close()

    @property
    def name(self) -> str:
        return self.shown()

    def __str__(self) -> str:
        return self.shown()


Location = Path | PgLocation


def is_postgres_url(text: str) -> bool:
    return urlsplit(str(text)).scheme in _SCHEMES


def location_of(value: str | Path | PgLocation) -> Location:
    """A store location from a path or a ``postgresql://…[?schema=…]`` URL; anything else is a path."""
    if isinstance(value, PgLocation):
        return value
    text = str(value)
    if not is_postgres_url(text):
        return Path(value)
    parts = urlsplit(text)
    query = dict(parse_qsl(parts.query))
    schema = query.pop("schema", DEFAULT_SCHEMA)
    if not _SCHEMA.match(schema):
        raise DatabaseError(f"schema {schema!r} in the control-plane URL: expected lowercase letters, digits and _")
    scheme = "postgresql" if parts.scheme == "postgresql+psycopg2" else parts.scheme
    return PgLocation(urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), "")), schema)


def control_plane(default: Path, table: str = "") -> Location:
    """Where a control-plane store of this deployment lives: ``default`` (its SQLite file under KEEL_HOME), or the
    Postgres schema ``$KEEL_CONTROL_PLANE`` names (``table``: the store's main table, for ``exists()``)."""
    given = os.environ.get(CONTROL_PLANE_ENV, "").strip()
    if not given or given == "sqlite":
        return default
    if not is_postgres_url(given):
        raise DatabaseError(
            f"${CONTROL_PLANE_ENV}={given!r}: expected unset, 'sqlite' or a postgresql://host/db?schema=… URL"
        )
    loc = location_of(given)
    return PgLocation(loc.url, loc.schema, table)


def shown(location: Location) -> str:
    return location.shown() if isinstance(location, PgLocation) else str(location)


def location_exists(location: Location, table: str) -> bool:
    """Whether a store was ever created at ``location`` (its file, or its table in the schema)."""
    if isinstance(location, PgLocation):
        return location.exists(table)
    return Path(location).exists()


class Database(Closing):
    """A connection in autocommit mode; ``write()`` opens the transactions. ``execute`` takes the stores' ``?``
    placeholders on both dialects and returns a cursor (``fetchone``, ``fetchall``, iteration)."""

    dialect: str

    def __init__(self, conn: Any, dialect: str, location: Location):
        self.conn, self.dialect, self.location = conn, dialect, location
        self._in_write = False

    @classmethod
    def open(cls, location: Location, *, busy_timeout_s: float = 30.0, create: bool = True) -> Database:
        if isinstance(location, PgLocation):
            return cls(_pg_connect(location, create=create), "postgres", location)
        from keel.storage import connect_durable

        return cls(connect_durable(location, busy_timeout_s=busy_timeout_s), "sqlite", Path(location))

    @property
    def postgres(self) -> bool:
        return self.dialect == "postgres"

    def close(self) -> None:
        self.conn.close()

    # -- statements --

    def sql(self, statement: str) -> str:
        return statement.replace("%", "%%").replace("?", "%s") if self.postgres else statement

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        if not self.postgres:
            return self.conn.execute(statement, params)
        cur = self.conn.cursor()
        cur.execute(self.sql(statement), tuple(params))
        return cur

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        if not self.postgres:
            self.conn.executemany(statement, rows)
            return
        with self.conn.cursor() as cur:
            cur.executemany(self.sql(statement), [tuple(r) for r in rows])

    def script(self, *, sqlite: str, postgres: str) -> None:
        """Create a store's tables: SQLite's script as is; Postgres's in one transaction under an advisory lock (two
        processes creating the same store at once would otherwise collide in the catalog)."""
        if not self.postgres:
            self.conn.executescript(sqlite)
            return
        with self.write():
            self.execute("SELECT pg_advisory_xact_lock(hashtext('keel-schema'))")
            with self.conn.cursor() as cur:
                cur.execute(postgres)

    @contextmanager
    def write(self, lock: str | None = None) -> Iterator[Database]:
        """One write transaction: committed at the end of the block, rolled back if it raises. ``lock``: the log
        table whose next number this transaction takes — writers of it queue here (Postgres: LOCK TABLE … IN
        EXCLUSIVE MODE, which readers never wait for; SQLite: BEGIN IMMEDIATE already serializes every writer)."""
        if self._in_write:  # a store's helper inside its caller's transaction
            yield self
            return
        self.execute("BEGIN IMMEDIATE" if not self.postgres else "BEGIN")
        self._in_write = True
        try:
            if lock and self.postgres:
                self.execute(f"LOCK TABLE {lock} IN EXCLUSIVE MODE")
            yield self
            self.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        finally:
            self._in_write = False

    def rollback(self) -> None:
        """End a transaction that failed or was refused, so that the connection is usable and its locks are freed.
        A ROLLBACK statement on both: the connections are in autocommit mode with explicit BEGIN, where psycopg2's
        ``conn.rollback()`` does nothing (the transaction would stay open, holding the log's lock)."""
        try:
            if self.postgres:
                import psycopg2.extensions as ext

                if self.conn.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                    self.conn.cursor().execute("ROLLBACK")
            elif self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the connection is gone: the server rolled the transaction back
            pass

    def notify(self, channel: str, payload: str) -> None:
        """Postgres: a notification delivered to every listener when this transaction commits (nothing on SQLite:
        its readers poll)."""
        if self.postgres:
            self.execute("SELECT pg_notify(?, ?)", (channel, payload))

    # -- catalog --

    def has_table(self, name: str) -> bool:
        if self.postgres:
            row = self.execute("SELECT to_regclass(?)", (f"{self.location.schema}.{name}",)).fetchone()
            return row[0] is not None
        row = self.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        return row is not None

    def integrity_problems(self) -> list[str]:
        """SQLite's own integrity check (Postgres checks its pages itself; nothing to ask)."""
        if self.postgres:
            return []
        result = self.execute("PRAGMA integrity_check").fetchone()[0]
        return [] if result == "ok" else [f"sqlite integrity_check: {result}"]

    def is_locked_error(self, exc: BaseException) -> bool:
        text = str(exc)
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def append_only_sql(tables: Sequence[str], what: str, *, dialect: str) -> str:
    """DDL refusing UPDATE and DELETE (and on Postgres TRUNCATE) of ``tables`` with "<what> is append-only"."""
    if dialect == "sqlite":
        return "\n".join(
            f"CREATE TRIGGER IF NOT EXISTS {t}_no_{op.lower()} BEFORE {op} ON {t} "
            f"BEGIN SELECT RAISE(ABORT, '{what} is append-only: {op} refused'); END;"
            for t in tables
            for op in ("UPDATE", "DELETE")
        )
    out = [
        "CREATE OR REPLACE FUNCTION keel_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION '% is append-only: % refused', TG_ARGV[0], TG_OP USING ERRCODE = 'integrity_constraint_violation'; "
        "END $$;"
    ]
    for t in tables:
        out.append(
            f"CREATE OR REPLACE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
            f"FOR EACH ROW EXECUTE FUNCTION keel_append_only('{what}');"
        )
        out.append(
            f"CREATE OR REPLACE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION keel_append_only('{what}');"
        )
    return "\n".join(out)


def _pg_connect(location: PgLocation, *, create: bool, attempts: int = 3) -> Any:
    """A psycopg2 connection in autocommit mode with ``search_path`` set to the location's schema (created when
    ``create``). Connecting is retried briefly (a server restarting); the error names the server, not the password."""
    import psycopg2

    last: Exception | None = None
    for attempt in range(attempts):
        try:
            conn = psycopg2.connect(location.url, connect_timeout=10, application_name="keel")
            break
        except psycopg2.OperationalError as exc:
            last = exc
            time.sleep(0.2 * (attempt + 1))
    else:
        reason = str(last).strip().splitlines()[0] if last else "unknown"
        raise DatabaseError(f"cannot connect to the control plane at {location.shown()}: {reason}") from None
    conn.autocommit = True
    with conn.cursor() as cur:
        if create:
            for schema in (location.schema, location.witness_schema):
                cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
                if cur.fetchone() is None:
                    cur.execute("SELECT pg_advisory_lock(hashtext('keel-schema'))")
                    try:
                        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                    finally:
                        cur.execute("SELECT pg_advisory_unlock(hashtext('keel-schema'))")
        cur.execute(f"SET search_path TO {location.schema}")
    return conn
