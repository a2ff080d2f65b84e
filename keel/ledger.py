"""The release ledger: an append-only, hash-chained log of which release was live from when, in SQLite (the embedded
default) or a Postgres schema (keel.sqldb: the same tables and guarantees).

SQLite in WAL mode with synchronous=FULL, or Postgres with its durable commits: an append acknowledged to the caller
survives a crash; appends queue on the log (gap-free numbers under concurrent writers). Each entry's hash covers its
content and the previous entry's hash, and each append checkpoints the new head with a key kept outside the
database (keel.chain), so ``verify`` detects an edited, reordered or removed entry, removed newest entries and a
recomputed chain; triggers refuse UPDATE and DELETE through SQL. A revert is a new entry pointing back at an earlier
one; nothing is rewritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.chain import GENESIS, Checkpoints, Link, known_head_problems, link_hash, verify_chain
from keel.errors import KeelError
from keel.sqldb import Database, Location, append_only_sql, location_of
from keel.storage import Closing

COLUMNS = "seq, release_id, live_from, manifest, reverts, prev_hash, hash"


def model_line(manifest: dict) -> str:
    """Which model a release is of: the training asset its model part names (``<use case>/<asset>``), else one
    line for every entry (a manifest without parts)."""
    model = manifest.get("model")
    parts = model.get("parts") if isinstance(model, dict) else None
    return str(parts.get("asset", "")) if isinstance(parts, dict) else ""


class LedgerError(KeelError):
    """The ledger refused an entry (bad time, unknown release) or cannot be read."""


@dataclass(frozen=True)
class LedgerEntry:
    seq: int
    release_id: str
    live_from: datetime
    manifest: dict[str, Any]
    reverts: int | None
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    entries: int
    problems: tuple[str, ...]


def _utc(ts: datetime | str) -> datetime:
    dt = datetime.fromisoformat(ts.replace("Z", "+00:00")) if isinstance(ts, str) else ts
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def entry_hash(
    prev_hash: str, seq: int, release_id: str, live_from: str, manifest_json: str, reverts: int | None
) -> str:
    return link_hash(prev_hash, [seq, release_id, live_from, manifest_json, reverts])


SCHEMA_SQLITE = """
CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY, release_id TEXT NOT NULL, live_from TEXT NOT NULL,
                                    manifest TEXT NOT NULL, reverts INTEGER, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS entries_live_from ON entries (live_from);
"""
SCHEMA_POSTGRES = """
CREATE TABLE IF NOT EXISTS entries (seq BIGINT PRIMARY KEY, release_id TEXT NOT NULL, live_from TEXT COLLATE "C" NOT NULL,
                                    manifest TEXT NOT NULL, reverts BIGINT, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS entries_live_from ON entries (live_from);
"""


class Ledger(Closing):
    """``location``: a SQLite file, or a Postgres schema (``postgresql://…?schema=…``; keel.sqldb)."""

    def __init__(self, location: str | Path | Location, *, key: bytes | None = None):
        self.location = location_of(location)
        self.path = self.location
        self._db = Database.open(self.location)
        self._db.script(
            sqlite=SCHEMA_SQLITE + append_only_sql(["entries"], "the ledger", dialect="sqlite"),
            postgres=SCHEMA_POSTGRES + append_only_sql(["entries"], "the ledger", dialect="postgres"),
        )
        self.checkpoints = Checkpoints(self._db, "ledger", key)
        if self.checkpoints.created:
            self.checkpoints.adopt(self._db.execute("SELECT seq, hash FROM entries ORDER BY seq").fetchall())

    def close(self) -> None:
        self._db.close()

    def append(
        self,
        release_id: str,
        manifest: dict[str, Any],
        live_from: datetime | str | None = None,
        *,
        reverts: int | None = None,
    ) -> LedgerEntry:
        """Record that ``release_id`` is live from ``live_from`` (default now). Returns once durable."""
        when = _utc(live_from) if live_from is not None else datetime.now(UTC)
        manifest_json = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
        with self._db.write(lock="entries"):
            last = self._db.execute("SELECT seq, live_from, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (last[0] + 1, last[2]) if last else (1, GENESIS)
            self.checkpoints.refuse_if_truncated(seq - 1)
            before = self._last_of_line(model_line(manifest))
            if before is not None and when < _utc(before):
                raise LedgerError(
                    f"live_from {when.isoformat()} is before its model's last entry's {before}: a model's releases "
                    "only move forward"
                )
            stamp = when.isoformat()
            digest = entry_hash(prev, seq, release_id, stamp, manifest_json, reverts)
            self._db.execute(
                "INSERT INTO entries (seq, release_id, live_from, manifest, reverts, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (seq, release_id, stamp, manifest_json, reverts, prev, digest),
            )
            self.checkpoints.record(seq, digest)
        fields = {"release_id": release_id, "live_from": stamp, "manifest": manifest_json, "reverts": reverts,
                  "prev_hash": prev}  # fmt: skip
        self.checkpoints.journal(seq, digest, fields)  # before the head: a head is never newer than the journal
        self.checkpoints.publish(seq, digest)
        return LedgerEntry(seq, release_id, when, manifest, reverts, prev, digest)

    def of_line(self, line: str) -> list[LedgerEntry]:
        """The entries of one model line (``model_line``: ``<use case>/<training asset>``), oldest first: the releases
        of that model alone, in a ledger several models share."""
        return [e for e in self.log() if model_line(e.manifest) == line]

    def _last_of_line(self, line: str) -> str | None:
        """live_from of the newest entry of model line ``line``. Each model's releases move forward in its own time:
        use cases replayed live on one clock each have their own span (keel/clock.py), 2013 beside 2017."""
        for stamp, manifest_json in self._db.execute("SELECT live_from, manifest FROM entries ORDER BY seq DESC"):
            if model_line(json.loads(manifest_json)) == line:
                return stamp
        return None

    def revert(self, to_seq: int, reason: str, live_from: datetime | str | None = None) -> LedgerEntry:
        """A new entry making the release of entry ``to_seq`` live again."""
        target = self.entry(to_seq)
        return self.append(target.release_id, target.manifest | {"revert_reason": reason}, live_from, reverts=to_seq)

    def _row(self, row: tuple) -> LedgerEntry:
        seq, release_id, live_from, manifest, reverts, prev, digest = row
        return LedgerEntry(seq, release_id, _utc(live_from), json.loads(manifest), reverts, prev, digest)

    def entry(self, seq: int) -> LedgerEntry:
        row = self._db.execute(f"SELECT {COLUMNS} FROM entries WHERE seq = ?", (seq,)).fetchone()
        if row is None:
            raise LedgerError(f"no ledger entry {seq}")
        return self._row(row)

    def log(self) -> list[LedgerEntry]:
        return [self._row(r) for r in self._db.execute(f"SELECT {COLUMNS} FROM entries ORDER BY seq")]

    def at(self, when: datetime | str) -> LedgerEntry | None:
        """The release live at ``when``: the latest entry whose live_from is at or before it (boundaries inclusive).

        live_from is stored as UTC ISO 8601 with a fixed offset, so text order is time order and one indexed query
        answers it.
        """
        stamp = _utc(when).isoformat()
        row = self._db.execute(
            f"SELECT {COLUMNS} FROM entries WHERE live_from <= ? ORDER BY live_from DESC, seq DESC LIMIT 1", (stamp,)
        ).fetchone()
        return self._row(row) if row else None

    def at_each(self, when: datetime | str) -> list[LedgerEntry]:
        """What was live at ``when`` for every model the ledger has released: per model line (``model_line``), its
        latest entry at or before ``when``, in the order of their entries. A release of one model leaves the
        others' lines as they were."""
        stamp = _utc(when).isoformat()
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM entries WHERE live_from <= ? ORDER BY live_from, seq", (stamp,)
        ).fetchall()
        latest: dict[str, LedgerEntry] = {}
        for row in rows:
            entry = self._row(row)
            latest[model_line(entry.manifest)] = entry
        return sorted(latest.values(), key=lambda e: e.seq)

    def verify(self, known_head: tuple[int, str] | None = None) -> VerifyResult:
        """The chain (keel.chain) and SQLite's integrity; ``known_head``: (seq, hash) a witness off this machine saw
        (an alert's ``witness.ledger``) — the log must hold it."""
        problems = []
        published = self.checkpoints.witnessed()  # before the log: an append landing meanwhile is no truncation
        problems += self._db.integrity_problems()
        links = [
            Link(seq, prev_hash, digest, entry_hash(prev_hash, seq, release_id, live_from, manifest, reverts))
            for seq, release_id, live_from, manifest, reverts, prev_hash, digest in self._db.execute(
                "SELECT seq, release_id, live_from, manifest, reverts, prev_hash, hash FROM entries ORDER BY seq"
            )
        ]
        problems += verify_chain(links, self.checkpoints, published=published)
        if known_head is not None:
            problems += known_head_problems(links, known_head)
        return VerifyResult(not problems, len(links), tuple(problems))
