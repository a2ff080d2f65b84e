"""Windowed drift against reference bins — the statistics both paths compute, and the batch (polars) side.

The reference is, per numeric feature, bin edges (deciles of the reference data) and the reference share per bin.
A window's statistic per feature is its count per bin (values below the first edge fall in bin 0, at or above the
last in the last bin; nulls are not counted) and from those counts the PSI against the reference shares. Counts are
integers, so the two paths agree exactly on them; the PSI is the same float formula on the same counts.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import polars as pl

EPS = 1e-4


def reference_bins(frame: pl.DataFrame, features: list[str], bins: int = 10) -> dict[str, Any]:
    out = {}
    for f in features:
        values = frame[f].drop_nulls().drop_nans() if frame[f].dtype.is_float() else frame[f].drop_nulls()
        qs = sorted({float(values.quantile(i / bins, "linear")) for i in range(1, bins)})
        counts = bin_counts(values.to_list(), qs)
        total = sum(counts)
        out[f] = {"edges": qs, "shares": [c / total for c in counts]}
    return out


def bin_of(value: float, edges: list[float]) -> int:
    for i, e in enumerate(edges):
        if value < e:
            return i
    return len(edges)


def bin_counts(values: list[float], edges: list[float]) -> list[int]:
    counts = [0] * (len(edges) + 1)
    for v in values:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            counts[bin_of(v, edges)] += 1
    return counts


def psi(counts: list[int], shares: list[float]) -> float:
    total = sum(counts)
    if total == 0:
        return math.nan
    out = 0.0
    for c, s in zip(counts, shares, strict=True):
        p, q = max(c / total, EPS), max(s, EPS)
        out += (p - q) * math.log(p / q)
    return out


def batch_windows(frame: pl.DataFrame, time_col: str, window: timedelta, reference: dict[str, Any]) -> list[dict]:
    """The batch path: tumbling windows over ``time_col`` (UTC, aligned to the epoch like Flink's TUMBLE), per window
    and feature the bin counts and PSI."""
    out = []
    f = frame.filter(pl.col(time_col).is_not_null()).with_columns(
        pl.col(time_col).dt.truncate(f"{int(window.total_seconds())}s").alias("__w")
    )
    for (start,), rows in sorted(f.group_by("__w"), key=lambda kv: kv[0][0]):
        entry = {"window_start": start.replace(tzinfo=None).isoformat(), "rows": rows.height, "features": {}}
        for feat, ref in reference.items():
            counts = bin_counts(rows[feat].to_list(), ref["edges"])
            entry["features"][feat] = {"counts": counts, "psi": psi(counts, ref["shares"])}
        out.append(entry)
    return out


def bin_case_sql(column: str, edges: list[float]) -> list[str]:
    """Flink SQL: one SUM per bin, the same bin rule as ``bin_of``."""
    parts = []
    for i in range(len(edges) + 1):
        conds = []
        if i > 0:
            conds.append(f"`{column}` >= CAST({edges[i - 1]!r} AS DOUBLE)")  # a bare 10.35 would be a DECIMAL
        if i < len(edges):
            conds.append(f"`{column}` < CAST({edges[i]!r} AS DOUBLE)")
        cond = " AND ".join(conds)
        parts.append(f"SUM(CASE WHEN `{column}` = `{column}` AND {cond} THEN 1 ELSE 0 END) AS `{column}__b{i}`")
    return parts
