"""Where a hash chain's newest checkpoint is published and its journal kept, outside the log's transaction
(keel/chain.py): beside a SQLite file, or in a second schema of a Postgres control plane."""

from __future__ import annotations

import json
import os
from pathlib import Path

HEAD_RECORD_BYTES = 512  # the published head: one JSON record, space-padded to a fixed size


class FileWitness:
    """The published head and the journal of a chain kept in a SQLite file: ``<db>.head`` (one fixed-size record
    rewritten in place) and ``<db>.journal`` (one JSON line per entry, O_APPEND) beside the database."""

    def __init__(self, db_path: str | Path):
        self.db_path = Path(db_path)
        self.head_path = self.db_path.with_name(self.db_path.name + ".head")
        self.journal_path = self.db_path.with_name(self.db_path.name + ".journal")
        self.name, self.journal_name = self.head_path.name, self.journal_path.name
        self.reset_hint = f"remove {self.head_path}"

    def publish(self, record: dict) -> None:
        current = self.read_head()
        if current is not None and current.get("seq", 0) > record["seq"]:
            return  # never moves backwards (a slower writer publishing an older head)
        # One fixed-size record rewritten in place with a single pwrite, not fsynced and not renamed (a rename over
        # the old file makes ext4 flush it: 0.7 ms a commit). After a power loss the file may be older than the log,
        # which verify accepts (it only has to not be newer), or torn, which reads as absent.
        data = json.dumps(record).encode()
        fd = os.open(self.head_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data.ljust(HEAD_RECORD_BYTES - 1) + b"\n", 0)
        finally:
            os.close(fd)

    def read_head(self) -> dict | None:
        try:
            text = self.head_path.read_bytes().decode()
            return json.loads(text) if text.strip() else None
        except FileNotFoundError:
            return None
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None

    def append_journal(self, seq: int, line: str) -> None:
        """One JSON line, O_APPEND: concurrent writers never interleave a line. Not fsynced, like the head: it guards
        against removal, not against power loss."""
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def journal_lines(self) -> list[str]:
        try:
            return self.journal_path.read_text().splitlines()
        except FileNotFoundError:
            return []


class TableWitness:
    """The published head and the journal of a chain kept in Postgres, where no filesystem is shared between the
    machines that write: rows of ``<schema>_witness.<chain>_published`` and ``<chain>_journal``, a schema of their
    own so that a deployment can give keel's role INSERT and SELECT only there (docs/stores.md). Written after the
    log's transaction committed, like the file: removing the newest log entries leaves the head pointing past the
    end; the newest published row is the head (it never moves backwards)."""

    def __init__(self, db, chain: str):
        self.db = db
        schema = db.location.witness_schema
        self.published, self.journal = f"{schema}.{chain}_published", f"{schema}.{chain}_journal"
        self.name, self.journal_name = self.published, self.journal
        self.reset_hint = f"DELETE FROM {self.published} the rows past the log's end"
        db.script(
            sqlite="",
            postgres=f"""
            CREATE TABLE IF NOT EXISTS {self.published} (seq BIGINT PRIMARY KEY, record TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS {self.journal} (seq BIGINT PRIMARY KEY, entry TEXT NOT NULL);
            """,
        )

    def _write(self, statement: str, params: tuple) -> None:
        """One round trip, and no wait for the disk: like the head file (rewritten in place, not fsynced), the
        witness guards against removal, not against power loss — a commit does not pay a second fsync for it."""
        try:
            self.db.execute(f"BEGIN; SET LOCAL synchronous_commit TO off; {statement}; COMMIT", params)
        except BaseException:
            self.db.rollback()  # the statement failed inside its BEGIN: end that transaction
            raise

    def publish(self, record: dict) -> None:
        # The newest row is the head: a slower writer's older head never moves it backwards.
        self._write(
            f"INSERT INTO {self.published} (seq, record) VALUES (?, ?) ON CONFLICT (seq) DO NOTHING",
            (int(record["seq"]), json.dumps(record)),
        )

    def read_head(self) -> dict | None:
        row = self.db.execute(f"SELECT record FROM {self.published} ORDER BY seq DESC LIMIT 1").fetchone()
        try:
            return json.loads(row[0]) if row else None
        except json.JSONDecodeError:
            return None

    def append_journal(self, seq: int, line: str) -> None:
        self._write(
            f"INSERT INTO {self.journal} (seq, entry) VALUES (?, ?) ON CONFLICT (seq) DO NOTHING", (seq, line)
        )

    def journal_lines(self) -> list[str]:
        return [r[0] for r in self.db.execute(f"SELECT entry FROM {self.journal} ORDER BY seq")]
