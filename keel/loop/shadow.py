"""Is a challenger better than the champion on the requests they both scored? The shadow verdict (issue 32).

A challenger in shadow scores every request beside the champion; when the labels of those requests are in, each row
gives a paired difference d = loss(challenger) − loss(champion) (keel/metrics.py ``per_row_loss``: log-loss for a
binary label, squared error for a regression). Rows are not independent: the flights of one day share its weather,
the bookings of one day its prices. So the mean difference is judged with a variance that respects clustering —
the cluster-robust (CR1) variance of a mean over G clusters,

    se² = G / (G − 1) · Σ_g (Σ_{i∈g} (d_i − d̄))² / n²,

and a one-sided Student-t bound with G − 1 degrees of freedom: the challenger is **better** only when
d̄ + t(1 − α, G − 1) · se < −margin. Too few labelled rows or too few clusters fails closed (the champion stays):
one good day is one observation, not hundreds. A day whose rows all move together counts as one.

Pure; ``shadow_verdict`` takes arrays, ``ShadowVerdict`` is the value a sensor turns into an action.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import t as student_t

from keel.metrics import LOSS_NAMES, per_row_loss


@dataclass(frozen=True)
class ShadowPolicy:
    margin: float = 0.0  # in the loss's units: how much better the challenger must surely be
    alpha: float = 0.05  # one-sided
    min_labelled: int = 200  # labelled rows scored by both
    min_clusters: int = 5  # distinct clusters (days) among them


DEFAULT_SHADOW = ShadowPolicy()


@dataclass(frozen=True)
class ShadowVerdict:
    better: bool
    reason: str
    labelled: int
    clusters: int
    loss: str
    delta: float | None = None  # mean of challenger − champion per row (negative: the challenger is better)
    se: float | None = None  # cluster-robust standard error of delta
    upper: float | None = None  # one-sided 1 − alpha bound of delta
    p_value: float | None = None  # one-sided: H0 delta ≥ −margin
    # the (simulated) time the labelled pairs cover, first to last cluster (None: not measured) — labels arrive late
    # on a busy machine, and a shadow is judged on the days its labels cover (keel/canary.py decide_shadow)
    labelled_span_s: float | None = None

    def as_metadata(self) -> dict:
        return asdict(self)


def clustered_mean_se(d: np.ndarray, clusters: np.ndarray) -> tuple[float, float, int]:
    """(mean, CR1 standard error of the mean, number of clusters) of ``d`` grouped by ``clusters``."""
    d = np.asarray(d, dtype=np.float64)
    _, group = np.unique(np.asarray(clusters), return_inverse=True)
    g = int(group.max()) + 1 if d.size else 0
    mean = float(d.mean()) if d.size else float("nan")
    if g < 2:
        return mean, float("nan"), g
    sums = np.bincount(group, weights=d - mean, minlength=g)
    var = g / (g - 1) * float(np.sum(sums**2)) / d.size**2
    return mean, float(np.sqrt(var)), g


def shadow_verdict(
    labels: np.ndarray,
    champion_scores: np.ndarray,
    challenger_scores: np.ndarray,
    clusters: np.ndarray,
    policy: ShadowPolicy = DEFAULT_SHADOW,
    task: str = "binary",
) -> ShadowVerdict:
    """The verdict on the rows both models scored whose labels are known; ``clusters`` names each row's cluster (its
    day, or hour). Rows with a non-finite score or label are left out (counted out of ``labelled``)."""
    if task not in LOSS_NAMES:
        raise ValueError(f"task must be one of {', '.join(LOSS_NAMES)}, got {task!r}")
    y, h, c = (np.asarray(a, dtype=np.float64) for a in (labels, champion_scores, challenger_scores))
    k = np.asarray(clusters)
    if not (y.shape == h.shape == c.shape == k.shape):
        raise ValueError(f"labels {y.shape}, scores {h.shape} / {c.shape} and clusters {k.shape} must align")
    keep = np.isfinite(y) & np.isfinite(h) & np.isfinite(c)
    y, h, c, k = y[keep], h[keep], c[keep], k[keep]
    loss = LOSS_NAMES[task]
    n, g = int(y.size), int(np.unique(k).size)
    if n < policy.min_labelled:
        return ShadowVerdict(False, f"{n} labelled rows: fewer than {policy.min_labelled} to judge on", n, g, loss)
    if g < policy.min_clusters:
        return ShadowVerdict(
            False, f"{g} days (clusters) of labels: fewer than {policy.min_clusters} to judge on", n, g, loss
        )
    d = per_row_loss(task, c, y) - per_row_loss(task, h, y)
    delta, se, g = clustered_mean_se(d, k)
    words = loss.replace("_", "-")
    if se == 0.0:  # the same answers on every row: nothing to tell them apart
        better = delta < -policy.margin
        return ShadowVerdict(better, f"{words} differs by exactly {delta:.4f} on every row", n, g, loss, delta, se,
                             delta, 0.0 if better else 1.0)  # fmt: skip
    upper = delta + float(student_t.ppf(1 - policy.alpha, g - 1)) * se
    p_value = float(student_t.cdf((delta + policy.margin) / se, g - 1))
    better = upper < -policy.margin
    if better:
        reason = f"{words} better by {-delta:.4f} over {g} days (bound {-upper:.4f} > margin {policy.margin})"
    elif delta < 0:
        reason = (f"{words} better by {-delta:.4f}, but not surely over {g} days (bound {-upper:.4f}, "
                  f"p = {p_value:.3f})")  # fmt: skip
    else:
        reason = f"{words} not better: worse by {delta:.4f} over {g} days"
    return ShadowVerdict(better, reason, n, g, loss, delta, se, upper, p_value)


def worse_pvalue(verdict: ShadowVerdict, margin: float) -> float:
    """One-sided p-value of H0: the challenger's loss exceeds the champion's by at most ``margin`` — small when it is
    surely worse by more (a canary's quality guard on the paired rows). NaN when the verdict has no variance to
    judge with (too few rows or days)."""
    if verdict.delta is None or verdict.se is None or not np.isfinite(verdict.se):
        return float("nan")
    if verdict.se == 0.0:
        return 0.0 if verdict.delta > margin else 1.0
    return float(student_t.sf((verdict.delta - margin) / verdict.se, verdict.clusters - 1))
