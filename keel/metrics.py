"""The metrics that judge a model, by the task of its label (``Label.task``, keel/features/spec.py).

- **binary**: the score is P(label = 1); the per-row loss is log-loss, and a model is summarised by AUC (ranking) and
  mean log-loss (calibration and ranking together);
- **regression**: the score is the predicted value; the per-row loss is the squared error, and a model is summarised
  by RMSE and MAE.

The gate, the canary's quality check and the loop report compare models on ``per_row_loss`` (lower is better, paired
on the same rows); ``summary`` is what they show beside it. Pure numpy; no model code.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import rankdata

EPS = 1e-15
TASKS = ("binary", "regression")
LOSS_NAMES = {"binary": "log_loss", "regression": "squared_error"}
SUMMARY = {"binary": ("auc", "log_loss"), "regression": ("rmse", "mae")}


def _task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return task


def per_row_loss(task: str, scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's loss under ``task`` (lower is better)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if _task(task) == "binary":
        p = np.clip(s, EPS, 1 - EPS)
        return -(y * np.log(p) + (1 - y) * np.log(1 - p))
    return (s - y) ** 2


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC from ranks (Mann-Whitney U); NaN when only one class is present."""
    pos = np.asarray(labels) == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def summary(task: str, scores: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    """The task's summary metrics (``SUMMARY[task]``) of ``scores`` against ``labels``; None where undefined."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if s.size == 0:
        return dict.fromkeys(SUMMARY[_task(task)])
    if _task(task) == "binary":
        out = {"auc": auc(s, y), "log_loss": float(per_row_loss(task, s, y).mean())}
    else:
        out = {"rmse": float(np.sqrt(np.mean((s - y) ** 2))), "mae": float(np.mean(np.abs(s - y)))}
    return {k: (v if v is not None and math.isfinite(v) else None) for k, v in out.items()}
