"""Recalibration as a cheap candidate (issue 32): the champion's trees, its raw score moved by an affine map fitted on
the newest labelled days, as a new LightGBM text model.

When the label's base rate drifts (the late share of flights jumps in December), the champion may still rank well
while its probabilities are off. Refitting the trees takes a month of labels; moving the output takes a few days:

- binary, ``intercept``: raw' = raw + b, b minimising log-loss of sigmoid(raw + b) (the base rate);
- binary, ``platt``: raw' = a · raw + b (Platt scaling on the raw score: base rate and confidence);
- regression, ``bias``: raw' = raw + b, b the mean residual (the price level moved).

``affine_model_text`` writes raw' into the model itself — every leaf value times a, and b added to the first tree's
leaves — so the result is an ordinary LightGBM text model (same trees, new sha256) that is registered, gated and
canaried like any challenger. Pure: arrays and text in, numbers and text out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from keel.loop.committee import TREE, scaled_leaves
from keel.metrics import per_row_loss

METHODS = {"binary": ("intercept", "platt"), "regression": ("bias",)}


@dataclass(frozen=True)
class Recalibration:
    method: str
    a: float  # raw' = a · raw + b
    b: float
    rows: int
    loss_before: float  # mean per-row loss on the rows it was fitted on
    loss_after: float

    def describe(self) -> str:
        move = f"raw × {self.a:.4f} + {self.b:+.4f}" if self.method == "platt" else f"raw {self.b:+.4f}"
        return f"{self.method} on {self.rows:,} rows: {move}; loss {self.loss_before:.4f} → {self.loss_after:.4f}"


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def fit_recalibration(task: str, raw: np.ndarray, labels: np.ndarray, method: str | None = None) -> Recalibration:
    """The affine map of the raw score (``raw``: the model's raw output — log-odds for a binary label, the value for a
    regression) that fits ``labels`` best by ``method`` (default: the task's first, ``intercept`` or ``bias``)."""
    method = method or METHODS.get(task, ("",))[0]
    if method not in METHODS.get(task, ()):
        raise ValueError(
            f"recalibration of a {task} model: method must be one of {METHODS.get(task)}, got {method!r}"
        )
    r, y = np.asarray(raw, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if r.shape != y.shape or r.size == 0:
        raise ValueError(f"raw scores {r.shape} and labels {y.shape} must align and not be empty")
    if task == "regression":
        a, b = 1.0, float(np.mean(y - r))
        before, after = per_row_loss(task, r, y).mean(), per_row_loss(task, r + b, y).mean()
        return Recalibration(method, a, b, int(r.size), float(before), float(after))
    a, b = _fit_logistic(r, y, slope=method == "platt")
    before = per_row_loss(task, _sigmoid(r), y).mean()
    after = per_row_loss(task, _sigmoid(a * r + b), y).mean()
    return Recalibration(method, a, b, int(r.size), float(before), float(after))


def _fit_logistic(r: np.ndarray, y: np.ndarray, slope: bool, iterations: int = 50) -> tuple[float, float]:
    """Newton's method on the log-loss of sigmoid(a·r + b): b alone (a = 1), or a and b. A tiny ridge keeps the
    step defined when the labels are all one class."""
    a, b = 1.0, 0.0
    for _ in range(iterations):
        p = _sigmoid(a * r + b)
        w = p * (1 - p) + 1e-9
        g_b = float(np.mean(p - y))
        if not slope:
            step_b = g_b / float(np.mean(w))
            b -= step_b
            if abs(step_b) < 1e-10:
                break
            continue
        g_a = float(np.mean((p - y) * r))
        h = np.array([[np.mean(w * r * r) + 1e-9, np.mean(w * r)], [np.mean(w * r), np.mean(w) + 1e-9]])
        step = np.linalg.solve(h, np.array([g_a, g_b]))
        a, b = a - float(step[0]), b - float(step[1])
        if float(np.abs(step).max()) < 1e-10:
            break
    return a, b


def affine_model_text(text: str, a: float, b: float) -> str:
    """The LightGBM text model whose raw score is ``a`` × the given model's + ``b``: every leaf value times ``a``,
    ``b`` added to the leaves of tree 0 (each row lands in exactly one leaf of it). Everything else — features,
    splits, thresholds — is unchanged."""
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"the affine map must be finite, got a={a}, b={b}")
    out, tree, leaves = [], None, 0
    for line in text.split("\n"):
        m = TREE.match(line)
        if m:
            tree = int(m.group(1))
        if line.startswith("leaf_value="):
            shift = b if tree == 0 else 0.0
            line = scaled_leaves(line, a, shift)
            leaves += 1
        if line.startswith("tree_sizes="):
            continue  # each tree's length in bytes: the new values changed them, so LightGBM parses tree by tree
        out.append(line)
    if leaves == 0:
        raise ValueError("not a LightGBM text model (no leaf_value lines)")
    return "\n".join(out)
