"""Challenger against champion, on the newest labelled month neither trained on: better by a margin, with evidence.

``challenger_gate`` compares the per-row loss of the model's task (keel/metrics.py: log-loss for a binary label,
squared error for a regression) on the same rows (paired): the mean difference Δ = challenger − champion and a
one-sided bootstrap upper bound of Δ at 1 − ``alpha``. The challenger passes only when that bound is below
−``margin`` (in the loss's units): it is better by at least the margin with confidence, not by luck on one month.
Too few labelled rows, or a non-finite score, fails closed (the champion stays). The task's summary metrics of both
(AUC and log-loss; RMSE and MAE) are reported beside it.

Pure and deterministic: the resampling is seeded by the policy, so the same inputs give the same verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from keel.metrics import LOSS_NAMES, per_row_loss, summary


@dataclass(frozen=True)
class ChallengerGatePolicy:
    margin: float = 0.001  # mean per-row loss the challenger must beat the champion by
    alpha: float = 0.05  # one-sided
    resamples: int = 2000
    min_rows: int = 1000
    seed: int = 20130101


DEFAULT_GATE = ChallengerGatePolicy()


@dataclass(frozen=True)
class ChallengerVerdict:
    passed: bool
    reason: str
    rows: int
    loss: str = "log_loss"  # the per-row loss compared (keel.metrics.LOSS_NAMES)
    champion_loss: float | None = None
    challenger_loss: float | None = None
    delta: float | None = None  # challenger − champion, mean per row (negative: the challenger is better)
    delta_upper: float | None = None  # one-sided 1 − alpha bootstrap bound of delta
    champion_metrics: dict[str, float | None] | None = None  # the task's summary (keel.metrics.summary)
    challenger_metrics: dict[str, float | None] | None = None

    def as_metadata(self) -> dict[str, float | int | str | bool | None]:
        """Flat: the loss and its delta, and each model's summary metrics as ``champion_<metric>`` /
        ``challenger_<metric>``."""
        out = {k: v for k, v in self.__dict__.items() if not k.endswith("_metrics")}
        for who in ("champion", "challenger"):
            out |= {f"{who}_{m}": v for m, v in (getattr(self, f"{who}_metrics") or {}).items()}
        return out


def bootstrap_upper(d: np.ndarray, alpha: float, resamples: int, seed: int, chunk: int = 100) -> float:
    """The 1 − ``alpha`` quantile of the bootstrap distribution of mean(``d``) (resampling rows with replacement),
    computed in chunks so memory stays at chunk × n."""
    rng = np.random.default_rng(seed)
    n = d.size
    means = np.empty(resamples)
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        idx = rng.integers(0, n, size=(k, n))
        means[start : start + k] = d[idx].mean(axis=1)
    return float(np.quantile(means, 1 - alpha))


def challenger_gate(
    labels: np.ndarray,
    champion_scores: np.ndarray,
    challenger_scores: np.ndarray,
    policy: ChallengerGatePolicy = DEFAULT_GATE,
    task: str = "binary",
) -> ChallengerVerdict:
    if task not in LOSS_NAMES:
        raise ValueError(f"task must be one of {', '.join(LOSS_NAMES)}, got {task!r}")
    labels = np.asarray(labels, dtype=np.float64)
    h = np.asarray(champion_scores, dtype=np.float64)
    c = np.asarray(challenger_scores, dtype=np.float64)
    if not (labels.shape == h.shape == c.shape):
        raise ValueError(f"labels {labels.shape}, champion {h.shape} and challenger {c.shape} scores must align")
    n = labels.size
    loss = LOSS_NAMES[task]
    if n < policy.min_rows:
        return ChallengerVerdict(False, f"{n} labelled rows: fewer than {policy.min_rows} to judge on", n, loss)
    if not (np.isfinite(h).all() and np.isfinite(c).all()):
        return ChallengerVerdict(False, "a score is not finite: cannot judge", n, loss)
    words = loss.replace("_", "-")
    lh, lc = per_row_loss(task, h, labels), per_row_loss(task, c, labels)
    d = lc - lh
    delta = float(d.mean())
    upper = bootstrap_upper(d, policy.alpha, policy.resamples, policy.seed)
    passed = upper < -policy.margin
    if passed:
        reason = f"{words} better by {-delta:.4f} (bound {-upper:.4f} > margin {policy.margin})"
    elif delta < 0:
        reason = f"{words} better by {-delta:.4f}, but not surely by the margin {policy.margin} (bound {-upper:.4f})"
    else:
        reason = f"{words} not better: worse by {delta:.4f}"
    return ChallengerVerdict(
        passed,
        reason,
        n,
        loss=loss,
        champion_loss=float(lh.mean()),
        challenger_loss=float(lc.mean()),
        delta=delta,
        delta_upper=upper,
        champion_metrics=summary(task, h, labels),
        challenger_metrics=summary(task, c, labels),
    )
