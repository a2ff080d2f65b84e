"""What a policy store holds, as values: a policy, a commit, the result of verifying the chain; the commit hash,
the tables' schema and the Postgres notification channel — shared by the writer (store.py) and the followers
(reader.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from keel.chain import link_hash
from keel.sqldb import Location, PgLocation


@dataclass(frozen=True)
class Policy:
    name: str
    type: str
    body: dict[str, Any]
    version: int  # the commit that last set it


@dataclass(frozen=True)
class Commit:
    version: int
    author: str
    reason: str
    committed_at: datetime
    reverts: int | None
    changes: dict[str, dict[str, Any]]  # name → {"type": …, "body": …}
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    commits: int
    problems: tuple[str, ...]


# -- the store --------------------------------------------------------------------------------------------------


def commit_hash(
    prev_hash: str, version: int, author: str, reason: str, at: str, reverts: int | None, changes: Mapping[str, Any]
) -> str:
    return link_hash(prev_hash, [version, author, reason, at, reverts, changes])


def _utc(ts: datetime | str) -> datetime:
    dt = datetime.fromisoformat(ts.replace("Z", "+00:00")) if isinstance(ts, str) else ts
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


SCHEMA_SQLITE = """
CREATE TABLE IF NOT EXISTS commits (
    version INTEGER PRIMARY KEY, author TEXT NOT NULL, reason TEXT NOT NULL, committed_at TEXT NOT NULL,
    reverts INTEGER, changes TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policy_versions (
    name TEXT NOT NULL, version INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (name, version));
CREATE INDEX IF NOT EXISTS commits_time ON commits (committed_at);
CREATE INDEX IF NOT EXISTS policy_versions_by_version ON policy_versions (version);
"""
SCHEMA_POSTGRES = """
CREATE TABLE IF NOT EXISTS commits (
    version BIGINT PRIMARY KEY, author TEXT NOT NULL, reason TEXT NOT NULL, committed_at TEXT COLLATE "C" NOT NULL,
    reverts BIGINT, changes TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policy_versions (
    name TEXT NOT NULL, version BIGINT NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (name, version));
CREATE INDEX IF NOT EXISTS commits_time ON commits (committed_at);
CREATE INDEX IF NOT EXISTS policy_versions_by_version ON policy_versions (version);
"""
APPEND_ONLY = ("commits", "policy_versions")
NOTIFY_CHANNEL = "keel_policies"  # Postgres: every commit notifies its version here (PolicyReader.listen)


def notify_channel(location: Location) -> str:
    """The channel a store's commits are announced on: one per schema, so two deployments on one server do not
    wake each other."""
    return f"{NOTIFY_CHANNEL}_{location.schema}" if isinstance(location, PgLocation) else NOTIFY_CHANNEL


def _commit(row: tuple) -> Commit:
    return Commit(
        version=row[0],
        author=row[1],
        reason=row[2],
        committed_at=datetime.fromisoformat(row[3]),
        reverts=row[4],
        changes=json.loads(row[5]),
        prev_hash=row[6],
        hash=row[7],
    )
