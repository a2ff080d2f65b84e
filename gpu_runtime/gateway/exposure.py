"""The exposure log: one JSON line per request the gateway answered, append-only, one file per UTC day.

Fields: ts, request_id, unit_id, tenant_id, risk_level, experiment_id, variant, model, model_version, sha256,
release_id, score, latency_ms, status, error, degraded. Each line is one ``write`` on a file opened with O_APPEND,
so lines from one process never interleave and an existing line is never rewritten; a crash can at most cut the
last line short, which readers skip. Later analysis reads the files with DuckDB (``read_json_auto``) or polars.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import orjson


class ExposureLog:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._day = ""
        self._fd: int | None = None

    def path_for(self, day: str) -> Path:
        return self.directory / f"exposures-{day}.jsonl"

    def append(self, record: dict[str, Any]) -> None:
        day = time.strftime("%Y%m%d", time.gmtime(record.get("ts") or time.time()))
        if day != self._day:
            self.close()
            self._fd = os.open(self.path_for(day), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._day = day
        os.write(self._fd, orjson.dumps(record, default=str, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._day = ""


def read_exposures(
    directory: str | Path, *, since: float | None = None, day: str | None = None
) -> list[dict[str, Any]]:
    """Every complete line of the day files, oldest day first (a torn last line is skipped). ``since`` (epoch
    seconds) skips whole files of earlier UTC days; ``day`` (YYYY-MM-DD) reads that day's file only."""
    first = time.strftime("%Y%m%d", time.gmtime(since)) if since else None
    wanted = day.replace("-", "") if day else None
    out = []
    for path in sorted(Path(directory).glob("exposures-*.jsonl")):
        stamp = path.stem.removeprefix("exposures-")
        if (first and stamp < first) or (wanted and stamp != wanted):
            continue
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
