"""The policy store: versioned serving policies with an immutable, hash-chained commit log — in a SQLite file (the
embedded default) or a Postgres schema (keel.sqldb; the same tables, values and guarantees).

The store holds named policies of the types in ``keel.policies.types`` — ``ab_test`` (variant weights), ``canary``
(steps, interval, thresholds), ``circuit_breaker``, ``rate_limit``, ``sla_tier``. A *commit* changes one or more of
them and gets the next version of the whole set (version = current + 1, gap-free); the state at version V is, per
name, the latest body committed at or before V. So ``at(time)``, ``diff(A, B)`` and ``revert(V)`` (a new commit
that sets every policy back to its body at V) are questions about the whole set, as an operator asks them.

Every commit is validated before it is written — a schema per type, weights summing to 1 within 1e-9, referenced
model versions present in the registry — and errors name the violated rule. Writes are one transaction each that
serializes writers (SQLite: ``BEGIN IMMEDIATE`` in WAL mode with ``synchronous=FULL``; Postgres: ``LOCK TABLE commits
IN EXCLUSIVE MODE``, readers never wait): a commit that returned survives a crash, versions are gap-free under
concurrent writers. Each commit's hash covers its content and the previous hash (``verify`` finds an edited,
reordered or removed commit); triggers refuse UPDATE and DELETE (and TRUNCATE on Postgres). A SQLite writer that
finds the database locked waits (busy timeout) and retries; "database is locked" never reaches a caller. On Postgres
each commit also notifies its version (``NOTIFY keel_policies_<schema>``) when it commits: followers
(``PolicyReader.listen``) pick it up at once instead of polling.

The values (records.py), the follower (reader.py) and policy files (files.py) are modules of their own; their names
are importable from here as before.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.chain import GENESIS, Checkpoints, Link, known_head_problems, verify_chain
from keel.policies.errors import PolicyError, PolicyValidationError
from keel.policies.files import load_policy_file
from keel.policies.reader import STATE_SQL, PolicyReader
from keel.policies.records import (
    APPEND_ONLY,
    SCHEMA_POSTGRES,
    SCHEMA_SQLITE,
    Commit,
    Policy,
    VerifyResult,
    _commit,
    _utc,
    commit_hash,
    notify_channel,
)
from keel.policies.types import validate_policy
from keel.sqldb import Database, Location, append_only_sql, location_of
from keel.storage import Closing


class PolicyStore(Closing):
    """``location``: a SQLite file (``Path``), or a Postgres schema (a ``postgresql://…?schema=…`` URL or a
    ``PgLocation``): the same tables, values and guarantees on both (keel.sqldb)."""

    def __init__(
        self,
        location: str | Path | Location,
        *,
        versions_of: Callable[[str], set[int]] | None = None,
        busy_timeout_s: float = 30.0,
        key: bytes | None = None,
    ):
        self.location = location_of(location)
        self.path = self.location  # what messages and older callers name
        self.versions_of = versions_of
        self.busy_timeout_s = busy_timeout_s
        self._db = self._retry(lambda: Database.open(self.location, busy_timeout_s=busy_timeout_s))
        self._retry(
            lambda: self._db.script(
                sqlite=SCHEMA_SQLITE + append_only_sql(APPEND_ONLY, "the policy log", dialect="sqlite"),
                postgres=SCHEMA_POSTGRES + append_only_sql(APPEND_ONLY, "the policy log", dialect="postgres"),
            )
        )
        self.checkpoints = self._retry(lambda: Checkpoints(self._db, "policy", key))
        if self.checkpoints.created:
            rows = self._db.execute("SELECT version, hash FROM commits ORDER BY version").fetchall()
            self._retry(lambda: self.checkpoints.adopt(rows))

    def close(self) -> None:
        self._db.close()

    def _retry(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; on SQLite's "database is locked" (past the busy timeout, or at BEGIN IMMEDIATE) wait and retry.
        (Postgres writers queue on the table lock instead.)"""
        deadline = time.monotonic() + self.busy_timeout_s * 4
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    # -- reads --

    def version(self) -> int:
        row = self._db.execute("SELECT MAX(version) FROM commits").fetchone()
        return int(row[0] or 0)

    def state(self, version: int | None = None) -> dict[str, Policy]:
        """Every policy as of ``version`` (default: the latest)."""
        v = self.version() if version is None else version
        rows = self._db.execute(STATE_SQL, (v,)).fetchall()
        return {r[0]: Policy(r[0], r[1], json.loads(r[2]), r[3]) for r in rows}

    def get(self, name: str, version: int | None = None) -> Policy | None:
        return self.state(version).get(name)

    def state_problems(self, policies: dict[str, Policy]) -> list[str]:
        """Why a state read from the policy table cannot be trusted: a body that is not the one its commit recorded,
        or a commit whose stored hash its content no longer matches (each policy is checked against the commit that
        set it; ``verify`` checks the whole chain)."""
        problems = []
        for name, p in sorted(policies.items()):
            try:
                c = self.commit(p.version)
            except PolicyError:
                problems.append(f"{name}: set in version {p.version}, which is not in the log")
                continue
            recomputed = commit_hash(
                c.prev_hash, c.version, c.author, c.reason, c.committed_at.isoformat(), c.reverts, c.changes
            )
            if recomputed != c.hash:
                problems.append(f"{name}: version {c.version} does not match its hash (the commit was edited)")
            elif c.changes.get(name, {}).get("body") != p.body or c.changes.get(name, {}).get("type") != p.type:
                problems.append(
                    f"{name}: the policy table's body is not the one version {c.version} committed "
                    f"(hash {c.hash[:12]}): edited outside keel"
                )
        return problems

    def commit_at(self, when: datetime | str) -> Commit | None:
        """The commit in force at ``when``: the newest committed at or before it."""
        row = self._db.execute(
            "SELECT version FROM commits WHERE committed_at <= ? ORDER BY version DESC LIMIT 1",
            (_utc(when).isoformat(),),
        ).fetchone()
        return self.commit(row[0]) if row else None

    def at(self, when: datetime | str) -> tuple[int, dict[str, Policy]]:
        c = self.commit_at(when)
        return (c.version, self.state(c.version)) if c else (0, {})

    def commit(self, version: int) -> Commit:
        row = self._db.execute(
            "SELECT version, author, reason, committed_at, reverts, changes, prev_hash, hash FROM commits "
            "WHERE version = ?",
            (version,),
        ).fetchone()
        if row is None:
            raise PolicyError(f"no policy version {version} (latest is {self.version()})")
        return _commit(row)

    def log(self) -> list[Commit]:
        rows = self._db.execute(
            "SELECT version, author, reason, committed_at, reverts, changes, prev_hash, hash FROM commits "
            "ORDER BY version"
        ).fetchall()
        return [_commit(r) for r in rows]

    def diff(self, a: int, b: int) -> dict[str, tuple[Policy | None, Policy | None]]:
        """Per policy name that differs between versions a and b: (as at a, as at b)."""
        for v in (a, b):
            if v < 0 or v > self.version():
                raise PolicyError(f"no policy version {v} (latest is {self.version()})")
        sa, sb = self.state(a), self.state(b)
        out = {}
        for name in sorted(set(sa) | set(sb)):
            pa, pb = sa.get(name), sb.get(name)
            if (pa and (pa.type, pa.body)) != (pb and (pb.type, pb.body)):
                out[name] = (pa, pb)
        return out

    # -- writes --

    def apply(
        self,
        changes: Mapping[str, tuple[str, dict[str, Any]]],
        *,
        author: str,
        reason: str,
        expected_version: int | None = None,
        reverts: int | None = None,
        at: datetime | None = None,
    ) -> Commit:
        """Commit ``changes`` (name → (type, body)) as the next version. ``expected_version``: refuse unless the
        new version is exactly that (optimistic concurrency for `keel policy commit`)."""
        if not changes:
            raise PolicyError("a commit needs at least one policy")
        if not author or not reason:
            raise PolicyError("a commit needs an author and a reason")
        for name, (type_, body) in changes.items():
            validate_policy(name, type_, body, self.versions_of)
        payload = {name: {"type": t, "body": b} for name, (t, b) in sorted(changes.items())}

        def write() -> Commit:
            with self._db.write(lock="commits"):
                last = self._db.execute(
                    "SELECT version, hash, committed_at FROM commits ORDER BY version DESC LIMIT 1"
                ).fetchone()
                current, prev_hash = (last[0], last[1]) if last else (0, GENESIS)
                self.checkpoints.refuse_if_truncated(current)
                version = current + 1
                if expected_version is not None and expected_version != version:
                    raise PolicyError(
                        f"version conflict: this commit was written for version {expected_version}, "
                        f"but the next version is {version} (someone committed since)"
                    )
                for name, (type_, _body) in changes.items():
                    row = self._db.execute(
                        "SELECT type FROM policy_versions WHERE name = ? ORDER BY version DESC LIMIT 1", (name,)
                    ).fetchone()
                    if row and row[0] != type_:
                        raise PolicyValidationError(
                            name, "type_fixed", f"is a {row[0]} policy; cannot become {type_}"
                        )
                when = _utc(at or datetime.now(UTC))
                if last and when.isoformat() < last[2]:
                    when = datetime.fromisoformat(last[2])  # time never runs backwards in the log
                stamp = when.isoformat()
                h = commit_hash(prev_hash, version, author, reason, stamp, reverts, payload)
                self._db.execute(
                    "INSERT INTO commits (version, author, reason, committed_at, reverts, changes, prev_hash, hash) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (version, author, reason, stamp, reverts, json.dumps(payload, sort_keys=True), prev_hash, h),
                )
                for name, (type_, body) in changes.items():
                    self._db.execute(
                        "INSERT INTO policy_versions (name, version, type, body) VALUES (?, ?, ?, ?)",
                        (name, version, type_, json.dumps(body, sort_keys=True)),
                    )
                self.checkpoints.record(version, h)
                self._db.notify(notify_channel(self.location), str(version))  # delivered when this commits
            return Commit(version, author, reason, when, reverts, payload, prev_hash, h)

        commit = self._retry(write)
        self._journal(commit)  # before the head is published: a head is never newer than the journal
        self.checkpoints.publish(commit.version, commit.hash)
        return commit

    # -- the journal: a copy of every commit outside the log, to restore removed newest commits from --

    def _journal(self, c: Commit) -> None:
        """Append the commit to the journal (keel.chain's witness: a file beside SQLite, a table on Postgres)."""
        self.checkpoints.journal(
            c.version, c.hash,
            {
                "version": c.version, "author": c.author, "reason": c.reason,
                "committed_at": c.committed_at.isoformat(), "reverts": c.reverts, "changes": c.changes,
                "prev_hash": c.prev_hash,
            },
        )  # fmt: skip

    def _journal_entries(self) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for line in self.checkpoints.witness.journal_lines():
            try:
                entry = json.loads(line)
                out[int(entry["version"])] = entry
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line (a crash mid-append) or garbage: never trusted, the hashes decide
        return out

    def restore_removed(self) -> list[int]:
        """Put back the newest commits that were removed from the database (the log ends before the published,
        keyed head), from the journal — only entries that chain onto the log's end and whose last hash is the
        published head's, so nothing that keel did not commit can enter. Returns the versions restored (none when
        nothing was removed); raises PolicyError saying what is missing when they cannot be restored."""
        published = self.checkpoints.read_head()
        if published is None:
            return []
        head_seq, head_hash = int(published.get("seq", 0)), str(published.get("hash", ""))
        if not hmac.compare_digest(str(published.get("mac", "")), self.checkpoints.mac(head_seq, head_hash)):
            raise PolicyError(f"{self.checkpoints.where}: the published head is not genuine; nothing restored")
        last = self._db.execute("SELECT version, hash FROM commits ORDER BY version DESC LIMIT 1").fetchone()
        newest, prev = (last[0], last[1]) if last else (0, GENESIS)
        if head_seq <= newest:
            return []
        journal = self._journal_entries()
        restored = []
        for v in range(newest + 1, head_seq + 1):
            e = journal.get(v)
            if e is None:
                raise PolicyError(
                    f"version {v} was removed and {self.checkpoints.witness.journal_name} has no copy of it"
                )
            h = commit_hash(prev, v, e["author"], e["reason"], e["committed_at"], e["reverts"], e["changes"])
            if e["prev_hash"] != prev or h != e["hash"]:
                raise PolicyError(
                    f"{self.checkpoints.witness.journal_name}: version {v} does not chain onto the log: not restored"
                )
            restored.append(e)
            prev = h
        if prev != head_hash:
            raise PolicyError(
                f"{self.checkpoints.witness.journal_name}: version {head_seq} does not match the published head"
            )

        def write() -> None:
            with self._db.write(lock="commits"):
                for e in restored:
                    self._db.execute(
                        "INSERT INTO commits (version, author, reason, committed_at, reverts, changes, prev_hash, "
                        "hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (e["version"], e["author"], e["reason"], e["committed_at"], e["reverts"],
                         json.dumps(e["changes"], sort_keys=True), e["prev_hash"], e["hash"]),
                    )  # fmt: skip
                    for name, change in e["changes"].items():
                        self._db.execute(
                            "INSERT INTO policy_versions (name, version, type, body) VALUES (?, ?, ?, ?)",
                            (name, e["version"], change["type"], json.dumps(change["body"], sort_keys=True)),
                        )
                    self.checkpoints.record(e["version"], e["hash"])

        self._retry(write)
        return [e["version"] for e in restored]

    def revert(self, version: int, *, author: str, reason: str) -> Commit:
        """A new commit that sets every policy back to its body at ``version`` (nothing is rewritten)."""
        target, now = self.state(version), self.state()
        if version < 1 or version > self.version():
            raise PolicyError(f"no policy version {version} (latest is {self.version()})")
        changes = {n: (p.type, p.body) for n, p in target.items() if n not in now or now[n].body != p.body}
        absent = sorted(set(now) - set(target))
        if absent:
            raise PolicyError(
                f"cannot revert to version {version}: policies {', '.join(absent)} did not exist then "
                "(policies are never deleted; commit their previous settings instead)"
            )
        if not changes:
            raise PolicyError(f"nothing to revert: the policies are already as at version {version}")
        return self.apply(changes, author=author, reason=f"revert to version {version}: {reason}", reverts=version)

    def verify(self, known_head: tuple[int, str] | None = None) -> VerifyResult:
        """The chain (keel.chain: links, edits, checkpoints, truncation, rollback against the journal), the policy
        table against the commits, and SQLite's own integrity check. ``known_head``: (version, hash) a witness off
        this machine saw (an alert's ``witness.policies``) — the log must hold it."""
        published = self.checkpoints.witnessed()  # before the log: a commit landing meanwhile is no truncation
        commits = self.log()
        links = [
            Link(
                c.version,
                c.prev_hash,
                c.hash,
                commit_hash(
                    c.prev_hash, c.version, c.author, c.reason, c.committed_at.isoformat(), c.reverts, c.changes
                ),
            )
            for c in commits
        ]
        problems = verify_chain(links, self.checkpoints, what="version", published=published)
        if known_head is not None:
            problems += known_head_problems(links, known_head, what="version")
        for c in commits:
            stored = {n: {"type": p["type"], "body": p["body"]} for n, p in c.changes.items()}
            rows = self._db.execute(
                "SELECT name, type, body FROM policy_versions WHERE version = ?", (c.version,)
            ).fetchall()
            if {r[0]: {"type": r[1], "body": json.loads(r[2])} for r in rows} != stored:
                problems.append(f"version {c.version}: the policy table does not match the commit")
        problems += self._db.integrity_problems()
        return VerifyResult(not problems, len(commits), tuple(problems))


__all__ = [
    "Commit",
    "Policy",
    "PolicyError",
    "PolicyReader",
    "PolicyStore",
    "PolicyValidationError",
    "VerifyResult",
    "commit_hash",
    "load_policy_file",
    "notify_channel",
    "validate_policy",
]
