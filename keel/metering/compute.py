"""Model compute time from Triton's statistics API, as the gateway samples it.

Triton keeps, per loaded model version, cumulative nanoseconds spent in compute (input, infer, output) since the
version was loaded. The gateway samples them every ``METER_INTERVAL_S`` (and once more when it stops) into
``$KEEL_HOME/serving/compute/compute-YYYYMMDD.jsonl``, one line per version and sample::

    {"ts": …, "model": "my-model", "model_version": 3, "compute_ns": 1234567, "executions": 120,
     "inferences": 480, "device": "cpu"}

``ts`` is the gateway's time (the simulated clock's in a live replay, like the exposure log's), so a sample falls on
the same day as the requests it follows. The compute of an interval is the difference of two consecutive samples of
a version; a counter that went down means Triton loaded the version again (a restart or a reload), and the interval
counts what the new counter says. An interval belongs to the day its closing sample falls on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

COMPUTE_PARTS = ("compute_input", "compute_infer", "compute_output")
DELTA_SCHEMA = {
    "day": pl.Utf8,
    "model": pl.Utf8,
    "model_version": pl.Int64,
    "device": pl.Utf8,
    "compute_s": pl.Float64,
}


@dataclass(frozen=True)
class ComputeSample:
    ts: float
    model: str
    model_version: int
    compute_ns: int  # cumulative since the version was loaded: input + infer + output
    executions: int
    inferences: int
    device: str = "cpu"  # cpu | gpu: which price applies (per_cpu_second, per_gpu_second)

    def as_record(self) -> dict[str, Any]:
        return {
            "ts": self.ts, "model": self.model, "model_version": self.model_version, "compute_ns": self.compute_ns,
            "executions": self.executions, "inferences": self.inferences, "device": self.device,
        }  # fmt: skip


def compute_ns(model_stats: dict[str, Any]) -> int:
    """Cumulative compute nanoseconds of one entry of Triton's ``model_stats`` (JSON form: int64s are strings)."""
    stats = model_stats.get("inference_stats") or {}
    return sum(int((stats.get(part) or {}).get("ns", 0) or 0) for part in COMPUTE_PARTS)


def sample_from_statistics(
    statistics: dict[str, Any], model: str, version: int, ts: float, device: str = "cpu"
) -> ComputeSample | None:
    """The sample of ``model`` ``version`` in a ``get_inference_statistics(as_json=True)`` answer (None: absent)."""
    for entry in statistics.get("model_stats") or []:
        if str(entry.get("version")) == str(version):
            return ComputeSample(
                ts, model, version, compute_ns(entry), int(entry.get("execution_count", 0) or 0),
                int(entry.get("inference_count", 0) or 0), device,
            )  # fmt: skip
    return None


def read_compute_samples(directory: str | Path, first_day: str | None = None, last_day: str | None = None):
    """Every whole sample line of the day files between ``first_day`` and ``last_day`` (YYYY-MM-DD, inclusive),
    oldest first; torn or foreign lines are skipped (a crash mid-append leaves at most one)."""
    lo = first_day.replace("-", "") if first_day else None
    hi = last_day.replace("-", "") if last_day else None
    out: list[ComputeSample] = []
    for path in sorted(Path(directory).glob("compute-*.jsonl")):
        stamp = path.stem.removeprefix("compute-")
        if (lo and stamp < lo) or (hi and stamp > hi):
            continue
        for raw in path.read_bytes().split(b"\n"):
            if not raw:
                continue
            try:
                r = orjson.loads(raw)
                out.append(
                    ComputeSample(
                        float(r["ts"]), str(r["model"]), int(r["model_version"]), int(r["compute_ns"]),
                        int(r.get("executions", 0)), int(r.get("inferences", 0)), str(r.get("device", "cpu")),
                    )
                )  # fmt: skip
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return out


def day_of(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def compute_deltas(samples: Iterable[ComputeSample], baseline: Iterable[ComputeSample] = ()) -> pl.DataFrame:
    """Compute seconds per day × model × version × device from consecutive samples. ``baseline``: samples from before
    the period (the last one of each version is where its first interval starts; without one, the first sample's
    counter counts from the version's load)."""
    last: dict[tuple[str, int], int] = {}
    for s in sorted(baseline, key=lambda s: s.ts):
        last[(s.model, s.model_version)] = s.compute_ns
    rows: dict[tuple[str, str, int, str], int] = {}
    for s in sorted(samples, key=lambda s: s.ts):
        key = (s.model, s.model_version)
        prev = last.get(key, 0)
        delta = s.compute_ns - prev if s.compute_ns >= prev else s.compute_ns  # went down: loaded again
        last[key] = s.compute_ns
        if delta:
            k = (day_of(s.ts), s.model, s.model_version, s.device)
            rows[k] = rows.get(k, 0) + delta
    return pl.DataFrame(
        [(d, m, v, dev, ns / 1e9) for (d, m, v, dev), ns in sorted(rows.items())],
        schema=DELTA_SCHEMA,
        orient="row",
    )
