"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Each write goes to a temporary file in the target's directory, is flushed and fsynced, then renamed over the
target (``os.replace`` is atomic on POSIX), and the directory is fsynced so the rename survives a crash.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl


class Closing:
    """``with store:`` closes it at the end of the block (the stores: registry, ledger, policies, online)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on an autocommit connection (``connect_durable``): BEGIN IMMEDIATE (writers queue here,
    not at the first write), COMMIT at the end of the block, ROLLBACK if the block raises — the store is as before."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def connect_durable(path: str | Path, *, busy_timeout_s: float = 30.0) -> sqlite3.Connection:
    """A SQLite connection for the control-plane logs (registry, ledger, policies): autocommit (callers open their
    own BEGIN IMMEDIATE), WAL so readers never block the writer, synchronous=FULL so a commit that returned survives
    a crash, and a busy timeout so a writer waits for another instead of failing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_s)
    db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def _atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_parquet_atomic(df: pl.DataFrame, path: str | Path) -> None:
    _atomic(Path(path), lambda fh: df.write_parquet(fh, compression="zstd", statistics=True))


def write_json_atomic(obj: Any, path: str | Path) -> None:
    data = json.dumps(obj, indent=2, sort_keys=False, default=str).encode() + b"\n"
    _atomic(Path(path), lambda fh: fh.write(data))


def write_text_atomic(text: str, path: str | Path) -> None:
    data = text.encode()
    _atomic(Path(path), lambda fh: fh.write(data))


def read_yaml(path: str | Path, error: type[Exception], what: str) -> Any:
    """A YAML file's content; a missing file or bad YAML raises ``error`` naming the file (and the line)."""
    import yaml

    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
