"""The exposure log: one JSON line per request the gateway answered, append-only, one file per UTC day.

Fields: ts, request_id, unit_id, tenant_id, risk_level, tier (the model's service tier), experiment_id, variant, routed_version, model,
model_version (null when the request ended before a version was chosen), sha256, release_id, score, latency_ms,
status, error, degraded, entity_key (keel/entity_key.py: how the request's outcome finds it). Later analysis reads the files with DuckDB (``read_json_auto``) or polars.

Writing: each line is one ``write`` on a file opened with O_APPEND by the one gateway process that owns the
directory, so an existing line is never rewritten. One append is one whole line or nothing: a short write (disk
full, a file-size limit) is cut back to where the line started, and a failed append is reported to the caller
(``append`` returns False; ``failures`` counts them) instead of raising — the gateway still answers, and says on
/metrics and /readyz that records were lost.

Reading: ``scan_exposures`` skips and counts every line that is not a whole record (torn by a crash, not UTF-8,
not a JSON object, a field of the wrong type) instead of failing the whole read.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


def day_stamp(path: Path, prefix: str) -> str:
    """The YYYYMMDD of a day file ``<prefix>-YYYYMMDD.jsonl`` or, of a gateway worker's, ``<prefix>-YYYYMMDD-w<i>.jsonl``
    ("" for a name of neither shape)."""
    rest = path.stem.removeprefix(f"{prefix}-")
    stamp, _, worker = rest.partition("-w")
    if len(stamp) != 8 or not stamp.isdigit() or (worker and not worker.isdigit()) or (_ and not worker):
        return ""
    return stamp


class ExposureLog:
    """An append-only JSON-lines log, one file per UTC day of each record's ``ts``: ``<prefix>-YYYYMMDD.jsonl``. The
    exposure log, and the gateway's other per-day logs (the compute meter's, keel/metering/compute.py). ``worker``:
    the gateway worker process that writes it (``<prefix>-YYYYMMDD-w<i>.jsonl``: every file has one writer)."""

    def __init__(self, directory: str | Path, prefix: str = "exposures", worker: int | None = None):
        self.directory = Path(directory)
        self.prefix = prefix
        self.worker = worker
        self.directory.mkdir(parents=True, exist_ok=True)
        self._day = ""
        self._fd: int | None = None
        self._size = 0  # bytes in the open day file: where a short write is cut back to
        self.failures = 0  # appends that wrote nothing (disk full, file-size limit, …)
        self.last_error: str | None = None

    def path_for(self, day: str) -> Path:
        suffix = f"-w{self.worker}" if self.worker is not None else ""
        return self.directory / f"{self.prefix}-{day}{suffix}.jsonl"

    def append(self, record: dict[str, Any]) -> bool:
        """Append one record as one line. True when the whole line is on disk; False when nothing of it is (the
        error is kept in ``last_error`` and counted in ``failures``)."""
        data = orjson.dumps(record, default=str, option=orjson.OPT_APPEND_NEWLINE)
        day = time.strftime("%Y%m%d", time.gmtime(record.get("ts") or time.time()))
        try:
            if day != self._day:
                self.close()
                self._fd = os.open(self.path_for(day), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._day = day
                self._size = os.fstat(self._fd).st_size  # this process is the file's only writer from here on
            written = os.write(self._fd, data)
            if written != len(data):
                os.ftruncate(self._fd, self._size)  # a torn line would merge with the next one: cut it back
                raise OSError(errno.EFBIG, f"short write: {written} of {len(data)} bytes")
            self._size += written
        except OSError as exc:
            self.failures += 1
            self.last_error = f"{self.path_for(day).name}: {exc.strerror or exc}"
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._day = ""


# Fields a record must have with these types to be read; anything else in the line is kept as it is.
_TYPES: dict[str, tuple[type, ...]] = {"ts": (int, float), "status": (int,)}
_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "model_version": (int,), "routed_version": (int,), "latency_ms": (int, float), "request_id": (str,),
    "unit_id": (str,), "tenant_id": (str,), "variant": (str,), "entity_key": (str,), "error": (str,),
}  # fmt: skip


@dataclass
class ExposureScan:
    """What a read found: the whole records, and how many lines were skipped (with the first few, located)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    examples: list[str] = field(default_factory=list)  # "exposures-20260101.jsonl:17: not JSON", at most 5

    def skip(self, where: str, why: str) -> None:
        self.skipped += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {why}")


def _problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    for name, types in _TYPES.items():
        v = record.get(name)
        if not isinstance(v, types) or isinstance(v, bool):
            return f"field {name!r} missing or not a number"
    for name, types in _OPTIONAL_TYPES.items():
        v = record.get(name)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            return f"field {name!r} has the wrong type"
    return None


def scan_exposures(
    directory: str | Path | Sequence[str | Path], *, since: float | None = None, day: str | None = None
) -> ExposureScan:
    """Every whole record of the day files, oldest day first. ``since`` (epoch seconds) skips whole files of
    earlier UTC days; ``day`` (YYYY-MM-DD) reads that day's file only. A line that is not a whole record is skipped
    and counted, never fatal to the read. ``directory`` may be several — one per gateway (``KeelHome.exposure_dirs``):
    the records of all of them, each directory's in its order."""
    first = time.strftime("%Y%m%d", time.gmtime(since)) if since else None
    wanted = day.replace("-", "") if day else None
    scan = ExposureScan()
    directories = [directory] if isinstance(directory, str | Path) else list(directory)
    files = [p for d in directories for p in sorted(Path(d).glob("exposures-*.jsonl"))]
    for path in files:
        stamp = day_stamp(path, "exposures")
        if not stamp or (first and stamp < first) or (wanted and stamp != wanted):
            continue
        data = path.read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for number, raw in enumerate(lines, 1):
            where = f"{path.name}:{number}"
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                scan.skip(where, "not UTF-8")
                continue
            except json.JSONDecodeError:
                scan.skip(where, "not JSON (a torn or corrupt line)")
                continue
            problem = _problem(record)
            if problem:
                scan.skip(where, problem)
                continue
            scan.records.append(record)
    return scan


def read_exposures(
    directory: str | Path, *, since: float | None = None, day: str | None = None
) -> list[dict[str, Any]]:
    """The whole records of ``scan_exposures`` (lines that are not whole records are skipped)."""
    return scan_exposures(directory, since=since, day=day).records
