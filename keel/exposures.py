"""What the exposure log says about each model version: the canary controller's (and experiments') evidence.

The gateway writes one JSON line per request (keel/exposure_log.py). Here they become per-arm
statistics for a time window:

- an arm is the version a request was **routed** to (``routed_version``), not the one that answered: a request
  routed to a failing challenger and answered by the fallback counts as a challenger error — the user saw no
  failure, the challenger did fail;
- errors: not answered (status ≠ 200), or answered by another version than the one routed to;
- p99 latency over the arm's answered requests;
- realized quality: log-loss of the arm's scores on requests whose outcome is known (``labels``: entity_key →
  the realized label, from the use case's validated rows, keel/entity_key.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from keel.canary_plan import ArmStats
from keel.entity_key import EntityKey
from keel.errors import KeelError
from keel.exposure_log import scan_exposures
from keel.features.spec import FeatureSet
from keel.home import asset_file
from keel.metrics import per_row_loss

EPS = 1e-15
MONTH = re.compile(r"\d{4}-\d{2}")  # a fixed pattern, not user input

# What "the evidence cannot be read now" raises: a log or label file gone, locked or refused by the engines, a model no
# installed use case serves. A decision path catches these as missing evidence; anything else is a bug, left to
# propagate so that it is never explained as missing data (issue 61 item 5).
UNREADABLE = (OSError, pl.exceptions.PolarsError, pa.ArrowException, KeelError)


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
        "model": pl.String,
        "status": pl.Int64,
        "model_version": pl.Int64,
        "routed_version": pl.Int64,
        "latency_ms": pl.Float64,
        "score": pl.Float64,
        "entity_key": pl.String,
        "error": pl.String,
        "unit_id": pl.String,
        "request_id": pl.String,
        "tenant_id": pl.String,
        "variant": pl.String,
        "shadow_version": pl.Int64,  # a version that scored the request in shadow (gpu_runtime/gateway/shadow.py)
        "shadow_score": pl.Float64,
    }
    data = {k: [] for k in schema}
    for r in rows:
        for k in schema:
            v = r.get(k)
            if k in ("score", "shadow_score"):  # one row's score; a batch's list has no single score
                v = v if isinstance(v, int | float) and not isinstance(v, bool) else None
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
    labels: Mapping[str, float] | None = None,
    task: str = "binary",
    slow_over_ms: float | None = None,
) -> ArmStats:
    """The statistics of requests routed to ``version`` with since ≤ ts < until; realized quality as the mean
    per-row loss of the model's ``task`` (keel/metrics.py: log-loss, or squared error for a regression); with
    ``slow_over_ms`` (the SLA tier's p99 target), how many answers were slower than it."""
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
        lab = answered.filter(pl.col("entity_key").is_in(list(labels)) & pl.col("score").is_not_null())
        if lab.height:
            y = lab["entity_key"].replace_strict(dict(labels), return_dtype=pl.Float64).to_numpy()
            losses = per_row_loss(task, lab["score"].to_numpy(), y)
            loss = float(losses.mean())
            var = float(losses.var(ddof=1)) if lab.height > 1 else None
            labelled = lab.height
    slow = None if slow_over_ms is None else int((answered["latency_ms"] > slow_over_ms).sum())
    return ArmStats(requests=n, errors=errors, p99_ms=p99, labelled=labelled, log_loss=loss, log_loss_var=var,
                    answered=answered.height, slow=slow)  # fmt: skip


def outcome_labels(fs: FeatureSet, rows: pl.DataFrame) -> dict[str, float]:
    """entity_key → the realized label (``fs.label``) of each of the entity's source ``rows`` whose label is known."""
    key = _key_of(fs)
    known = rows.with_columns(fs.label.expr.alias("_y")).filter(pl.col("_y").is_not_null())
    keys = known.select(key.expr().alias("k"), pl.col("_y")).unique("k", keep="first")
    return dict(zip(keys["k"].to_list(), keys["_y"].to_list(), strict=True))


def _key_of(fs: FeatureSet) -> EntityKey:
    if fs.entity.key is None:
        raise ValueError(f"the {fs.entity.name} entity declares no key: exposures cannot meet their outcomes")
    return fs.entity.key


def realized_labels(fs: FeatureSet, entity_keys: pl.Series, storage_dir: Path | None) -> dict[str, float]:
    """entity_key → realized label for the given keys whose outcome is in: the entity's validated rows of the
    months the keys name (``<storage>/<source>/<month>.parquet``, as the pipeline stores them)."""
    if storage_dir is None or entity_keys.is_empty():
        return {}
    key = _key_of(fs)
    keys = entity_keys.drop_nulls()
    months = sorted(set(keys.to_frame("k").select(key.month(pl.col("k")))["k"].to_list()))
    paths = [asset_file(Path(storage_dir), [fs.entity.source], m) for m in months if MONTH.fullmatch(m)]
    columns = list(dict.fromkeys([*key.columns, key.time, *fs.label.expr.meta.root_names()]))
    frames = [pl.read_parquet(p, columns=columns) for p in paths if p.exists()]
    return outcome_labels(fs, pl.concat(frames)) if frames else {}
