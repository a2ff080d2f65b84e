"""The control-plane backends the store tests run against: a SQLite file, and a fresh schema of the machine's real
PostgreSQL server (127.0.0.1:5432, trust auth — started before every session and CI run), dropped afterwards.

``Raw`` is what someone with write access to the database does behind keel's back: plain SQL, with the append-only
triggers out of the way when asked (SQLite: DROP TRIGGER; Postgres: ALTER TABLE … DISABLE TRIGGER USER)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from keel.sqldb import Location, PgLocation, location_of

CONTROL_PLANES = ("sqlite", "postgres")
PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
TEST_KEY = "keel-tests-chain-key"  # a Postgres control plane needs $KEEL_CHAIN_KEY (no key file beside it)


@contextmanager
def fresh_location(kind: str, directory: Path, name: str = "store") -> Iterator[Location]:
    """A location where nothing was stored yet: ``<directory>/<name>.sqlite``, or a schema of its own on the real
    server (the schema and its witness schema are dropped at the end)."""
    if kind == "sqlite":
        yield directory / f"{name}.sqlite"
        return
    schema = f"keel_t_{uuid.uuid4().hex[:12]}"
    try:
        yield location_of(f"{PG_SERVER}?schema={schema}")
    finally:
        drop_schema(schema)


def drop_schema(schema: str) -> None:
    import psycopg2

    conn = psycopg2.connect(PG_SERVER)
    conn.autocommit = True
    with conn.cursor() as cur:
        # Anything a test left connected would block the DROP: end those sessions first.
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query ILIKE %s",
            (f"%{schema}%",),
        )
        cur.execute("SET lock_timeout = '30s'")
        cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # a name made here, not input
        cur.execute(f"DROP SCHEMA IF EXISTS {schema}_witness CASCADE")
    conn.close()


def env_for(location: Location) -> dict[str, str]:
    """What a subprocess (a writer, the CLI) needs in its environment to use ``location``."""
    return {"KEEL_CHAIN_KEY": TEST_KEY} if isinstance(location, PgLocation) else {}


def url_of(location: Location) -> str:
    """``location`` as the command line takes it (a path, or the URL with its schema)."""
    if isinstance(location, PgLocation):
        return f"{location.url}?schema={location.schema}"
    return str(location)


class Raw:
    """Plain SQL on a store's database, ``?`` placeholders on both backends, autocommit."""

    def __init__(self, location: Location):
        self.location = location
        self.postgres = isinstance(location, PgLocation)
        if self.postgres:
            import psycopg2

            self.conn = psycopg2.connect(location.url)
            self.conn.autocommit = True
            self.conn.cursor().execute(f"SET search_path TO {location.schema}")
            self.refused = psycopg2.IntegrityError
        else:
            self.conn = sqlite3.connect(location, isolation_level=None)
            self.refused = sqlite3.IntegrityError

    def execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        if not self.postgres:
            return self.conn.execute(sql, params).fetchall()
        with self.conn.cursor() as cur:
            cur.execute(sql.replace("%", "%%").replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def without_triggers(self, *tables: str) -> Raw:
        """Take the append-only enforcement of ``tables`` away, as an owner of the database can."""
        for table in tables:
            if self.postgres:
                self.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
            else:
                for (name,) in self.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,)
                ):
                    self.execute(f'DROP TRIGGER "{name}"')
        return self

    def close(self) -> None:
        self.conn.close()
