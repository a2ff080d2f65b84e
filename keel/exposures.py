"""What the exposure log says about each model version: the canary controller's (and experiments') evidence.

The gateway writes one JSON line per request (keel/exposure_log.py). Here they become per-arm
statistics for a time window:

- an arm is the version a request was **routed** to (``routed_version``), not the one that answered: a request
  routed to a failing challenger and answered by the fallback counts as a challenger error — the user saw no
  failure, the challenger did fail;
- errors: not answered (status ≠ 200), or answered by another version than the one routed to;
- p99 latency over the arm's answered requests;
- realized quality: log-loss of the arm's scores on requests whose flight outcome is known (``labels``:
  flight_key → 0/1, from validated flights: arr_delay > 15 min).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from keel.canary import ArmStats
from keel.exposure_log import scan_exposures
from keel.flight_key import flight_key_expr, key_month
from keel.home import asset_file

EPS = 1e-15
MONTH = re.compile(r"\d{4}-\d{2}")  # a fixed pattern, not user input


def read_exposure_frame(directory: str | Path, *, since: float | None = None, day: str | None = None) -> pl.DataFrame:
    """The exposure log as a frame: every whole record, or only the day files from ``since``'s UTC day on, or
    one ``day`` (YYYY-MM-DD) — a sensor looking at one step or one experiment reads no older days."""
    return read_exposure_scan(directory, since=since, day=day)[0]


def read_exposure_scan(directory: str | Path, *, since: float | None = None, day: str | None = None):
    """``read_exposure_frame`` and the scan it came from (``.skipped``: lines that were not whole records, with
    located ``.examples``), for readers that report what they skipped."""
    scan = scan_exposures(directory, since=since, day=day)
    return exposure_frame(scan.records), scan


def exposure_frame(rows: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    schema = {
        "ts": pl.Float64,
        "status": pl.Int64,
        "model_version": pl.Int64,
        "routed_version": pl.Int64,
        "latency_ms": pl.Float64,
        "score": pl.Float64,
        "flight_key": pl.String,
        "error": pl.String,
        "unit_id": pl.String,
        "request_id": pl.String,
        "tenant_id": pl.String,
        "variant": pl.String,
    }
    data = {k: [] for k in schema}
    for r in rows:
        score = r.get("score")
        for k in schema:
            v = r.get(k)
            if k == "score":
                v = score if isinstance(score, int | float) else None
            elif schema[k] == pl.String and v is not None and not isinstance(v, str):
                v = str(v)
            data[k].append(v)
    return pl.DataFrame(data, schema=schema)


def arm_stats(
    frame: pl.DataFrame,
    version: int,
    *,
    since: float,
    until: float | None = None,
    labels: Mapping[str, int] | None = None,
) -> ArmStats:
    """The statistics of requests routed to ``version`` with since ≤ ts < until."""
    f = frame.filter((pl.col("routed_version") == version) & (pl.col("ts") >= since))
    if until is not None:
        f = f.filter(pl.col("ts") < until)
    n = f.height
    if n == 0:
        return ArmStats(requests=0, errors=0, p99_ms=None, labelled=0, log_loss=None)
    ok = (pl.col("status") == 200) & (pl.col("model_version") == version)
    errors = int(f.select((~ok).fill_null(True).sum()).item())
    answered = f.filter(ok)
    p99 = float(answered["latency_ms"].quantile(0.99, "nearest")) if answered.height else None
    labelled, loss, var = 0, None, None
    if labels:
        lab = answered.filter(pl.col("flight_key").is_in(list(labels)) & pl.col("score").is_not_null())
        if lab.height:
            y = lab["flight_key"].replace_strict(dict(labels), return_dtype=pl.Float64).to_numpy()
            p = lab["score"].clip(EPS, 1 - EPS).to_numpy()
            losses = -(y * np.log(p) + (1 - y) * np.log(1 - p))
            loss = float(losses.mean())
            var = float(losses.var(ddof=1)) if lab.height > 1 else None
            labelled = lab.height
    return ArmStats(requests=n, errors=errors, p99_ms=p99, labelled=labelled, log_loss=loss, log_loss_var=var)


def outcome_labels(validated_flights: pl.DataFrame, late_minutes: float = 15) -> dict[str, int]:
    """flight_key → 1 when the flight arrived more than ``late_minutes`` late, for flights whose outcome is in."""
    known = validated_flights.filter(pl.col("arr_delay").is_not_null())
    keys = known.select(
        flight_key_expr().alias("k"),
        (pl.col("arr_delay") > late_minutes).cast(pl.Int8).alias("y"),
    ).unique("k", keep="first")
    return dict(zip(keys["k"].to_list(), keys["y"].to_list(), strict=True))


LABEL_COLUMNS = ["carrier", "flight", "origin", "time_hour", "arr_delay"]


def realized_labels(flight_keys: pl.Series, storage_dir: Path | None) -> dict[str, int]:
    """flight_key → 1/0 (arrived > 15 min late) for the given flights whose outcome is in: the validated flights of
    the months the keys name (``<storage>/validated_flights/<month>.parquet``, as the pipeline stores them)."""
    if storage_dir is None or flight_keys.is_empty():
        return {}
    keys = flight_keys.drop_nulls()
    months = sorted(set(keys.to_frame("k").select(key_month(pl.col("k")))["k"].to_list()))
    paths = [asset_file(Path(storage_dir), ["validated_flights"], m) for m in months if MONTH.fullmatch(m)]
    frames = [pl.read_parquet(p, columns=LABEL_COLUMNS) for p in paths if p.exists()]
    return outcome_labels(pl.concat(frames)) if frames else {}
