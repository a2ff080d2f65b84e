"""Append-only hash chains with keyed checkpoints: the one implementation behind the release ledger and the policy
store.

Each entry's hash covers its fields and the previous entry's hash (``link_hash``), so an edited, reordered or
removed *inner* entry breaks the chain. That alone cannot catch two things a person with write access to the
database can do: delete the newest entries (the rest still chains), or rewrite entries and recompute every hash
after them. Keyed checkpoints close both, with a key kept outside the database:

- every append also writes, in the same transaction, a checkpoint of the new head: HMAC-SHA256(key, chain name,
  sequence number, hash). Without the key nobody can make a checkpoint, so a recomputed chain, or an entry added
  by anything but keel, has a head without a valid checkpoint;
- after the commit, each entry is copied to a *journal* (one keyed line per entry, append-only) and the newest
  checkpoint is *published*, both outside the log's transaction — to a file beside a
  SQLite database (``<db>.head``), or to a table of a second schema for a Postgres one (``<schema>_witness``: no
  filesystem is shared between machines; ``TableWitness``). Removing the newest entries (and their checkpoint rows)
  leaves the published head pointing past the end of the log; restoring the database *and* its head from an older
  copy (a rollback) leaves the journal holding genuine entries past the log's end.

``verify_chain`` checks all of it. The key comes from ``$KEEL_CHAIN_KEY`` or, for a SQLite store when unset, from a
file created on first use with mode 0600 (``keys/chain.key`` beside the database, i.e. under KEEL_HOME); a Postgres
store requires the variable (``chain_key``). What remains possible for someone who can write the files or both
schemas is documented in docs/policy.md ("What the chain proves") and docs/stores.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from keel.chain_witness import HEAD_RECORD_BYTES, FileWitness, TableWitness  # noqa: F401 - re-exported
from keel.errors import KeelError

GENESIS = "0" * 64
KEY_ENV = "KEEL_CHAIN_KEY"


class ChainKeyError(KeelError):
    """The checkpoint key cannot be read or created, or is readable by others."""


class ChainTruncatedError(KeelError):
    """The log ends before the newest published checkpoint: its newest entries were removed. Nothing is appended
    until an operator looks (``verify`` says which entries are gone)."""


def link_hash(prev_hash: str, fields: list) -> str:
    """One link of a chain: sha256 of the previous hash and the entry's fields as canonical JSON."""
    body = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


def key_path(db_path: Path) -> Path:
    return Path(db_path).resolve().parent / "keys" / "chain.key"


def load_key(db_path: str | Path) -> bytes:
    """``$KEEL_CHAIN_KEY``, else the 0600 key file beside the database (created with 32 random bytes on first use)."""
    given = os.environ.get(KEY_ENV)
    if given:
        return given.encode()
    path = key_path(Path(db_path))
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it first
            return load_key(db_path)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
            fh.flush()
            os.fsync(fh.fileno())
        return load_key(db_path)
    with os.fdopen(fd) as fh:
        if os.fstat(fh.fileno()).st_mode & 0o077:
            raise ChainKeyError(f"{path}: the checkpoint key must be readable by its owner only (chmod 600 {path})")
        key = fh.read().strip()
    if not key:
        raise ChainKeyError(f"{path}: the checkpoint key file is empty")
    return key.encode()


@dataclass(frozen=True)
class Witnessed:
    """What the witness knew when a verifier started: the published head and the journal's genuine entries (seq →
    hash). Read *before* the log: a commit lands in the log first, then in the journal, then in the head."""

    head: dict | None
    journal: dict[int, str]


@dataclass(frozen=True)
class Link:
    """What verify needs of one stored entry: its number, stored previous hash and hash, and the hash recomputed
    from its stored fields."""

    seq: int
    prev_hash: str
    hash: str
    recomputed: str


def chain_key(db) -> bytes:
    """The checkpoint key of a store: ``$KEEL_CHAIN_KEY``; a SQLite store may fall back to its 0600 key file, a
    Postgres store may not (its writers run on several machines: the key is a secret they are given)."""
    if db.postgres:
        given = os.environ.get(KEY_ENV)
        if not given:
            raise ChainKeyError(
                f"{db.location.shown()}: a control plane on Postgres needs ${KEY_ENV} (the chain checkpoints' "
                "HMAC key, the same secret on every machine that writes or verifies it)"
            )
        return given.encode()
    return load_key(db.location)


class Checkpoints:
    """Keyed checkpoints of a chain's head: a table in the chain's database, and the newest one published outside
    the log's transaction (``FileWitness`` beside a SQLite file, ``TableWitness`` for a Postgres schema)."""

    def __init__(self, db, chain: str, key: bytes | None = None):
        self.db, self.chain = db, chain
        self.witness = TableWitness(db, chain) if db.postgres else FileWitness(db.location)
        self.key = key if key is not None else chain_key(db)
        self.table = f"{chain}_checkpoints"
        exists = db.has_table(self.table)
        db.script(
            sqlite=f"CREATE TABLE IF NOT EXISTS {self.table} (seq INTEGER PRIMARY KEY, hash TEXT NOT NULL, "
            "mac TEXT NOT NULL)",
            postgres=f"CREATE TABLE IF NOT EXISTS {self.table} (seq BIGINT PRIMARY KEY, hash TEXT NOT NULL, "
            "mac TEXT NOT NULL)",
        )
        self.created = not exists  # a log from before checkpoints: the store adopts its entries once

    @property
    def where(self) -> str:
        return self.witness.name

    def mac(self, seq: int, digest: str) -> str:
        return hmac.new(self.key, f"{self.chain}|{seq}|{digest}".encode(), hashlib.sha256).hexdigest()

    def record(self, seq: int, digest: str) -> None:
        """Inside the caller's write transaction: the checkpoint of the new head."""
        self.db.execute(
            f"INSERT INTO {self.table} (seq, hash, mac) VALUES (?, ?, ?) "
            "ON CONFLICT (seq) DO UPDATE SET hash = excluded.hash, mac = excluded.mac",
            (seq, digest, self.mac(seq, digest)),
        )

    def refuse_if_truncated(self, head_seq: int) -> None:
        """Inside the caller's write transaction, before it appends after ``head_seq``: an append on a truncated log
        would overwrite the evidence (the published head), so it is refused."""
        published = self.read_head()
        if published is None:
            return
        seq = int(published.get("seq", 0))
        if seq > head_seq and hmac.compare_digest(
            str(published.get("mac", "")), self.mac(seq, str(published.get("hash")))
        ):
            raise ChainTruncatedError(
                f"{shown_location(self.db)}: the log ends at entry {head_seq} but entry {seq} was published "
                f"({self.witness.name}): its newest entries were removed. Nothing is appended until this is "
                f"resolved; if the database was restored from a backup on purpose, {self.witness.reset_hint}"
            )

    def publish(self, seq: int, digest: str) -> None:
        """After the commit: the newest checkpoint outside the log's transaction (never moves backwards)."""
        self.witness.publish({"chain": self.chain, "seq": seq, "hash": digest, "mac": self.mac(seq, digest)})

    def read_head(self) -> dict | None:
        """The published head, or None when there is none (never published, or torn by a power loss)."""
        return self.witness.read_head()

    def journal_line(self, seq: int, digest: str, fields: dict) -> str:
        """One journal line: the entry's fields, its hash and a checkpoint of it (only keel, with the key, writes a
        line that verify counts)."""
        return json.dumps(fields | {"seq": seq, "hash": digest, "mac": self.mac(seq, digest)}, sort_keys=True)

    def journal(self, seq: int, digest: str, fields: dict) -> None:
        """After the commit, before the head is published (a head is never newer than the journal)."""
        self.witness.append_journal(seq, self.journal_line(seq, digest, fields))

    def journaled(self) -> dict[int, str]:
        """seq → hash of every genuine journal line (a torn last line, garbage or a line without a valid checkpoint
        is not counted: those cannot make verify fail, nor hide anything)."""
        out: dict[int, str] = {}
        for line in self.witness.journal_lines():
            try:
                entry = json.loads(line)
                seq, digest = int(entry.get("seq", entry.get("version"))), str(entry["hash"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if hmac.compare_digest(str(entry.get("mac", "")), self.mac(seq, digest)):
                out[seq] = digest
        return out

    def witnessed(self) -> Witnessed:
        """The head and the journal, as a verifier reads them before the log."""
        return Witnessed(self.read_head(), self.journaled())

    def valid(self, seq: int, digest: str) -> bool:
        """Whether the stored checkpoint of ``seq`` is a genuine one for ``digest``."""
        row = self.db.execute(f"SELECT hash, mac FROM {self.table} WHERE seq = ?", (seq,)).fetchone()
        return bool(row) and row[0] == digest and hmac.compare_digest(row[1], self.mac(seq, digest))

    def problems(self, links: list[Link], published: Witnessed | dict | None | object = ...) -> list[str]:
        """``published``: what the witness knew *before* the log was read (``witnessed()``; a verifier running beside
        writers must read it first — a commit reaches the journal and the head after the log, so a witness read
        afterwards can be newer than the log read and look like a truncation). Read now when not given; a bare head
        (dict or None) checks the head only."""
        out = []
        if published is ...:
            published = self.witnessed()
        journal: dict[int, str] = {}
        if isinstance(published, Witnessed):
            published, journal = published.head, published.journal
        stored = {
            seq: (digest, mac) for seq, digest, mac in self.db.execute(f"SELECT seq, hash, mac FROM {self.table}")
        }
        for link in links:
            digest, mac = stored.get(link.seq, (None, ""))
            if digest is None:
                out.append(f"entry {link.seq} has no checkpoint: written without the key (not by keel)")
            elif not hmac.compare_digest(mac, self.mac(link.seq, digest)):
                out.append(f"checkpoint {link.seq}: not made with this store's key (forged, or the key changed)")
            elif digest != link.hash:
                out.append(f"entry {link.seq}: does not match its checkpoint (the chain was rewritten)")
        newest = links[-1].seq if links else 0
        by_seq = {link.seq: link for link in links}
        if journal and max(journal) > newest:
            top = max(journal)
            out.append(
                f"the log ends at entry {newest} but {self.witness.journal_name} holds genuine entries up to {top}: "
                f"entries {newest + 1}…{top} were rolled back (the database, and its head, restored to an older state)"
            )
        for seq, digest in sorted(journal.items()):
            if seq in by_seq and by_seq[seq].hash != digest:
                out.append(f"entry {seq}: does not match its journal line in {self.witness.journal_name} (rewritten)")
                break
        if published is not None:
            seq, digest = int(published.get("seq", -1)), str(published.get("hash", ""))
            if not hmac.compare_digest(str(published.get("mac", "")), self.mac(seq, digest)):
                out.append(f"{self.witness.name}: the published head is not a genuine checkpoint")
            elif seq > newest:
                out.append(
                    f"the log ends at entry {newest} but entry {seq} was published by {self.witness.name}: "
                    f"entries {newest + 1}…{seq} were removed (truncated)"
                )
            elif seq in by_seq and by_seq[seq].hash != digest:
                out.append(f"entry {seq}: does not match the published head (the chain was rewritten)")
        return out

    def adopt(self, entries: Iterable[tuple[int, str]]) -> int:
        """Checkpoint entries written before this store had checkpoints (trust on first use, once, when the
        checkpoint table is created on an existing log). Returns how many were adopted."""
        rows = [(seq, digest, self.mac(seq, digest)) for seq, digest in entries]
        self.db.executemany(
            f"INSERT INTO {self.table} (seq, hash, mac) VALUES (?, ?, ?) ON CONFLICT DO NOTHING", rows
        )
        if rows:
            self.publish(*rows[-1][:2])
        return len(rows)


def parse_head(text: str) -> tuple[int, str]:
    """``SEQ:HASH`` (a head as alerts and ``verify`` print it; the hash may be shortened to 12+ characters)."""
    seq, sep, digest = text.partition(":")
    digest = digest.strip().lower()
    if not sep or not seq.strip().isdigit() or len(digest) < 12 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"a head is SEQ:HASH (entry number, then 12 or more hex digits of its hash), got {text!r}")
    return int(seq), digest


def known_head_problems(links: list[Link], head: tuple[int, str], what: str = "entry") -> list[str]:
    """Problems against a head a witness off this machine saw (an alert's ``witness``, a note kept elsewhere): the
    log must hold that entry with that hash. This is what catches a rollback of *every* local file at once."""
    seq, digest = head
    newest = links[-1].seq if links else 0
    by_seq = {link.seq: link for link in links}
    if seq > newest:
        return [
            f"a witness saw {what} {seq} ({digest[:12]}), but the log ends at {what} {newest}: the store was "
            f"rolled back (its newest {seq - newest} {what}(s) are gone, with whatever recorded them here)"
        ]
    if seq not in by_seq or not by_seq[seq].hash.startswith(digest):
        return [f"{what} {seq} is not the one a witness saw ({digest[:12]}): the chain was rewritten"]
    return []


def published_heads(home) -> dict[str, str]:
    """The policy store's and the ledger's published heads as ``SEQ:HASH`` (SQLite control plane: read from their
    ``.head`` files, no database opened) — what alerts carry off this machine (keel.alerts)."""
    out = {}
    for chain, path in (("policies", home.policies), ("ledger", home.ledger)):
        if not isinstance(path, Path):
            continue  # a Postgres control plane: its witness schema is the witness off this machine already
        head = FileWitness(path).read_head() if path.exists() else None
        if head and "seq" in head and "hash" in head:
            out[chain] = f"{int(head['seq'])}:{head['hash']}"
    return out


def shown_location(db) -> str:
    loc = db.location
    return loc.shown() if hasattr(loc, "shown") else str(loc)


def verify_chain(
    links: Iterable[Link],
    checkpoints: Checkpoints | None,
    what: str = "entry",
    published: Witnessed | dict | None | object = ...,
) -> list[str]:
    """Every problem of a chain: numbering gaps, broken links, edited entries, and (with checkpoints) forged or
    missing checkpoints, a rewritten chain or removed newest entries. ``published``: the head read before the links
    (see ``Checkpoints.problems``)."""
    problems: list[str] = []
    prev, expected = GENESIS, 1
    seen: list[Link] = []
    for link in links:
        if link.seq != expected:
            problems.append(f"{what} {expected} is missing or out of order (next is {link.seq})")
            expected = link.seq
        if link.prev_hash != prev:
            problems.append(
                f"{what} {link.seq}: previous-hash does not match {what} {link.seq - 1} (reordered or removed)"
            )
        if link.recomputed != link.hash:
            problems.append(f"{what} {link.seq}: content does not match its hash (edited)")
        prev, expected = link.hash, link.seq + 1
        seen.append(link)
    if checkpoints is not None:
        problems += checkpoints.problems(seen, published)
    return problems
