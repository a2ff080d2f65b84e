"""The model registry: LightGBM text files addressed by sha256, metadata and aliases in SQLite (or the control
plane's Postgres schema: ``metadata_location``).

Files live at ``<root>/models/<sha256>.txt`` (written atomically; never pickles). ``registry.sqlite`` (WAL,
synchronous=FULL) holds each model's metadata (training partitions and data versions, contract hashes, feature code
hash, params, metrics, Dagster run id), the aliases ``champion`` / ``challenger`` / ``archived``, and an append-only
event log of every alias change with its reason. Loading verifies the hash: a corrupt or edited file is an error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.errors import KeelError
from keel.names import validate_name
from keel.sqldb import Database, Location, control_plane, location_exists, location_of
from keel.storage import Closing, _atomic

ALIASES = ("champion", "challenger", "archived")
# Where a gate records its verdict in a model's metadata: the quality gate of a first model (``{"passed": bool}``)
# and the challenger gate of a drift decision (one row per candidate; ``chosen`` is the candidate it passed).
QUALITY_GATE_KEY = "gate"
CHALLENGER_GATE_KEY = "challenger_gate"


def passed_a_gate(metadata: dict[str, Any]) -> bool:
    """Whether a registered model was vetted: its quality gate passed, or the challenger gate chose it. Only such a
    model (or a champion, past or present) may answer a request; a model no gate has judged has not passed."""
    quality = metadata.get(QUALITY_GATE_KEY) or {}
    challenger = metadata.get(CHALLENGER_GATE_KEY) or {}
    return quality.get("passed") is True or challenger.get("chosen") is True


def coarse_name(model: str) -> str:
    """The registry name of ``model``'s coarse fallback model (keel/training/coarse.py)."""
    return f"{model}-coarse"


class RegistryError(KeelError):
    """A model is missing, corrupt or tampered with, or an alias operation is invalid."""


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    sha256: str
    metadata: dict[str, Any]
    registered_at: datetime


SCHEMA_SQLITE = """
CREATE TABLE IF NOT EXISTS models (name TEXT NOT NULL, sha256 TEXT NOT NULL, metadata TEXT NOT NULL,
                                   registered_at TEXT NOT NULL, PRIMARY KEY (name, sha256));
CREATE TABLE IF NOT EXISTS aliases (name TEXT NOT NULL, alias TEXT NOT NULL, sha256 TEXT NOT NULL,
                                    PRIMARY KEY (name, alias));
CREATE TABLE IF NOT EXISTS alias_events (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
                                         alias TEXT NOT NULL, sha256 TEXT, previous TEXT, reason TEXT NOT NULL,
                                         at TEXT NOT NULL);
"""
# Postgres has no rowid: ``id`` numbers the models in the order they were registered (registrations queue on the
# table, so a later registration never gets a smaller id — a model's registry version never changes).
SCHEMA_POSTGRES = """
CREATE TABLE IF NOT EXISTS models (id BIGSERIAL UNIQUE, name TEXT NOT NULL, sha256 TEXT NOT NULL,
                                   metadata TEXT NOT NULL, registered_at TEXT NOT NULL, PRIMARY KEY (name, sha256));
CREATE TABLE IF NOT EXISTS aliases (name TEXT NOT NULL, alias TEXT NOT NULL, sha256 TEXT NOT NULL,
                                    PRIMARY KEY (name, alias));
CREATE TABLE IF NOT EXISTS alias_events (id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, alias TEXT NOT NULL,
                                         sha256 TEXT, previous TEXT, reason TEXT NOT NULL, at TEXT NOT NULL);
"""


def metadata_location(root: str | Path) -> Location:
    """Where the metadata of the registry at ``root`` lives: ``<root>/registry.sqlite``, or the control plane's
    Postgres schema when ``$KEEL_CONTROL_PLANE`` names one (the model files stay under ``root``: immutable,
    content-addressed, written atomically — safe on a shared volume or an object store's mount)."""
    return control_plane(Path(root) / "registry.sqlite")


class ModelRegistry(Closing):
    def __init__(self, root: str | Path, *, metadata: str | Path | Location | None = None):
        self.root = Path(root)
        (self.root / "models").mkdir(parents=True, exist_ok=True)
        self.location = location_of(metadata) if metadata is not None else metadata_location(self.root)
        self._db = Database.open(self.location)
        self._db.script(sqlite=SCHEMA_SQLITE, postgres=SCHEMA_POSTGRES)
        self._order = "id" if self._db.postgres else "rowid"  # registration order

    def close(self) -> None:
        self._db.close()

    def path_of(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise RegistryError(f"not a sha256: {sha256!r}")
        return self.root / "models" / f"{sha256}.txt"

    def register(self, name: str, model_text: str, metadata: dict[str, Any]) -> RegisteredModel:
        """Store the model (idempotent: the same text is the same model) and its metadata. Registering the same
        text again (a retraining that reproduced the model) updates the keys it gives and keeps the others — the
        evaluation metrics and gate verdict annotated since stay with the model."""
        validate_name(name, what="model name")
        data = model_text.encode()
        sha = hashlib.sha256(data).hexdigest()
        path = self.path_of(sha)
        if not path.exists():
            _atomic(path, lambda fh: fh.write(data))
        now = datetime.now(UTC)
        with self._db.write(
            lock="models"
        ):  # read-merge-write as one transaction: concurrent annotations are not lost
            row = self._db.execute(
                "SELECT metadata, registered_at FROM models WHERE name = ? AND sha256 = ?", (name, sha)
            ).fetchone()
            merged = {**json.loads(row[0]), **metadata} if row else dict(metadata)
            self._db.execute(
                "INSERT INTO models (name, sha256, metadata, registered_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(name, sha256) DO UPDATE SET metadata = excluded.metadata",
                (name, sha, json.dumps(merged, sort_keys=True, default=str), now.isoformat()),
            )
        return RegisteredModel(name, sha, merged, datetime.fromisoformat(row[1]) if row else now)

    def annotate(self, name: str, sha256: str, extra: dict[str, Any]) -> RegisteredModel:
        """Add keys to a registered model's metadata (evaluation metrics, gate verdict); the model file is untouched."""
        current = self.get(name, sha256)
        metadata = {**current.metadata, **extra}
        self._db.execute(
            "UPDATE models SET metadata = ? WHERE name = ? AND sha256 = ?",
            (json.dumps(metadata, sort_keys=True, default=str), name, sha256),
        )
        return RegisteredModel(name, sha256, metadata, current.registered_at)

    def load(self, sha256: str) -> str:
        """The model text, after checking that its bytes still hash to ``sha256``."""
        path = self.path_of(sha256)
        if not path.exists():
            raise RegistryError(f"model {sha256[:12]} is not in the registry at {path}")
        data = path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise RegistryError(
                f"model file {path} is corrupt or was modified: its sha256 is {actual[:12]}…, expected {sha256[:12]}…"
            )
        return data.decode()

    def get(self, name: str, sha256: str) -> RegisteredModel:
        row = self._db.execute(
            "SELECT metadata, registered_at FROM models WHERE name = ? AND sha256 = ?", (name, sha256)
        ).fetchone()
        if row is None:
            raise RegistryError(f"model {name}@{sha256[:12]} is not registered")
        return RegisteredModel(name, sha256, json.loads(row[0]), datetime.fromisoformat(row[1]))

    def version(self, name: str, sha256: str) -> int:
        """The model's registry version: 1 for the first model registered under ``name``, 2 for the next, …
        (Triton serves registry version N as model version N)."""
        row = self._db.execute(
            f"SELECT COUNT(*) FROM models WHERE name = ? AND {self._order} <= "
            f"(SELECT {self._order} FROM models WHERE name = ? AND sha256 = ?)",
            (name, name, sha256),
        ).fetchone()
        if (
            not row
            or row[0] == 0
            or self._db.execute("SELECT 1 FROM models WHERE name = ? AND sha256 = ?", (name, sha256)).fetchone()
            is None
        ):
            raise RegistryError(f"model {name}@{sha256[:12]} is not registered")
        return int(row[0])

    def versions(self, name: str) -> list[int]:
        """The registry versions of ``name``: 1 … the number of models registered under it."""
        n = self._db.execute("SELECT COUNT(*) FROM models WHERE name = ?", (name,)).fetchone()[0]
        return list(range(1, int(n) + 1))

    def sha_of_version(self, name: str, version: int) -> str:
        """The sha256 of registry version ``version`` of ``name`` (the inverse of ``version``)."""
        row = self._db.execute(
            f"SELECT sha256 FROM models WHERE name = ? ORDER BY {self._order} LIMIT 1 OFFSET ?",
            (name, max(version - 1, 0)),
        ).fetchone()
        if row is None or version < 1:
            raise RegistryError(f"model {name} has no registry version {version}")
        return row[0]

    def alias(self, name: str, alias: str) -> str | None:
        row = self._db.execute("SELECT sha256 FROM aliases WHERE name = ? AND alias = ?", (name, alias)).fetchone()
        return row[0] if row else None

    def set_alias(self, name: str, alias: str, sha256: str, reason: str) -> None:
        if alias not in ALIASES:
            raise RegistryError(f"unknown alias {alias!r} (known: {', '.join(ALIASES)})")
        self.get(name, sha256)
        with self._db.write(lock="aliases"):
            self._set(name, alias, sha256, reason)

    def _set(self, name: str, alias: str, sha256: str, reason: str) -> None:
        previous = self.alias(name, alias)
        self._db.execute(
            "INSERT INTO aliases (name, alias, sha256) VALUES (?, ?, ?) ON CONFLICT(name, alias) DO UPDATE SET sha256 = excluded.sha256",
            (name, alias, sha256),
        )
        self._db.execute(
            "INSERT INTO alias_events (name, alias, sha256, previous, reason, at) VALUES (?, ?, ?, ?, ?, ?)",
            (name, alias, sha256, previous, reason, datetime.now(UTC).isoformat()),
        )

    def promote(self, name: str, sha256: str, reason: str) -> None:
        """Make ``sha256`` the champion; the previous champion becomes archived. One transaction."""
        self.get(name, sha256)
        with self._db.write(lock="aliases"):
            previous = self.alias(name, "champion")
            if previous and previous != sha256:
                self._set(name, "archived", previous, f"replaced by {sha256[:12]}: {reason}")
            self._set(name, "champion", sha256, reason)

    def rollback(self, name: str, reason: str) -> str:
        """Restore the previous champion (the archived one); returns its sha256."""
        with self._db.write(lock="aliases"):
            archived, current = self.alias(name, "archived"), self.alias(name, "champion")
            if archived is None:
                raise RegistryError(f"model {name} has no archived champion to roll back to")
            self._set(name, "champion", archived, f"rollback: {reason}")
            if current:
                self._set(name, "archived", current, f"rolled back: {reason}")
        return archived

    def events(self, name: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT alias, sha256, previous, reason, at FROM alias_events WHERE name = ? ORDER BY id", (name,)
        )
        return [dict(zip(("alias", "sha256", "previous", "reason", "at"), r, strict=True)) for r in rows]


def versions_lookup(root: str | Path) -> Callable[[str], set[int]] | None:
    """``model → its registry versions`` for the registry at ``root`` (None when there is none there): what the
    policy store checks model versions against."""
    if not location_exists(metadata_location(root), "models"):
        return None

    def versions_of(model: str) -> set[int]:
        reg = ModelRegistry(root)
        try:
            return set(reg.versions(model))
        finally:
            reg.close()

    return versions_of
