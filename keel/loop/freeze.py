"""When a feature is served frozen, and when it stops: only on evidence, never forever.

- ``decide_freeze``: a drifted feature is frozen only when, on recent labelled rows, the serving model scores
  better with the feature frozen (its reference value) than live — the same paired bootstrap of per-row log-loss
  as the challenger gate (``keel.loop.gate``), with "frozen" as the challenger. Every freeze gets an expiry.
- ``freezes_to_clear``: the freezes that end now — expired ones, and those a promotion made unnecessary: a model
  trained on months that include the drift that caused the freeze has learned the new distribution, so serving the
  feature live is what it was trained for.

Pure: times and months come in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from keel.loop.gate import ChallengerGatePolicy, challenger_gate


@dataclass(frozen=True)
class FreezePolicy:
    min_gain: float = 0.0005  # mean per-row log-loss that freezing must win by, with confidence
    alpha: float = 0.05
    min_rows: int = 1000
    expiry: timedelta = timedelta(days=30)


DEFAULT_FREEZE = FreezePolicy()


@dataclass(frozen=True)
class FreezeDecision:
    feature: str
    freeze: bool
    reason: str
    drift_window: str  # the month whose drift report raised it
    expires_at: datetime | None = None
    live_log_loss: float | None = None
    frozen_log_loss: float | None = None


@dataclass(frozen=True)
class ActiveFreeze:
    feature: str
    drift_window: str  # YYYY-MM: the drifted month that caused it
    expires_at: datetime


def decide_freeze(
    feature: str,
    drift_window: str,
    labels: np.ndarray,
    live_scores: np.ndarray,
    frozen_scores: np.ndarray,
    now: datetime,
    policy: FreezePolicy = DEFAULT_FREEZE,
    task: str = "binary",
) -> FreezeDecision:
    """``live_scores``/``frozen_scores``: the serving model's scores on the same recent labelled rows, with the
    feature as served and with it replaced by its freeze value; compared on the per-row loss of ``task``."""
    verdict = challenger_gate(
        labels,
        live_scores,
        frozen_scores,
        ChallengerGatePolicy(margin=policy.min_gain, alpha=policy.alpha, min_rows=policy.min_rows),
        task,
    )
    common = dict(
        feature=feature,
        drift_window=drift_window,
        live_log_loss=verdict.champion_loss,
        frozen_log_loss=verdict.challenger_loss,
    )
    if not verdict.passed:
        return FreezeDecision(
            freeze=False, reason=f"serving {feature} frozen is not better: {verdict.reason}", **common
        )
    return FreezeDecision(
        freeze=True,
        reason=f"drift in {drift_window}; frozen {feature} serves better: {verdict.reason}",
        expires_at=now + policy.expiry,
        **common,
    )


def freezes_to_clear(
    active: list[ActiveFreeze], now: datetime, promoted_trained_on: tuple[str, ...] | None = None
) -> dict[str, str]:
    """{feature: why} for the freezes that end now: expired, or made unnecessary by the promoted model having been
    trained on the drifted month (``promoted_trained_on``: its training months, when a promotion just happened)."""
    out = {}
    learned = set(promoted_trained_on or ())
    for f in active:
        if f.drift_window in learned:
            out[f.feature] = f"the promoted model was trained on {f.drift_window}, the drift that froze it"
        elif now >= f.expires_at:
            out[f.feature] = f"expired at {f.expires_at.isoformat(timespec='seconds')}"
    return out


def freeze_evidence(
    model_text: str,
    frame,
    feature: str,
    value: float | None,
    drift_window: str,
    now: datetime,
    fs,
    policy: FreezePolicy = DEFAULT_FREEZE,
) -> FreezeDecision:
    """``decide_freeze`` on a frame of labelled rows (the drifted month's features of the feature set ``fs``): the
    serving model's scores with ``feature`` as it is, and with it replaced by ``value`` (what the online store would
    serve frozen), compared on the loss of its label's task."""
    import polars as pl

    from keel.training.model import predict

    if value is None:
        return FreezeDecision(feature, False, f"{feature} has no reference value to serve frozen", drift_window)
    live, labels = predict(model_text, frame, fs)
    frozen, _ = predict(model_text, frame.with_columns(pl.lit(value).cast(frame.schema[feature]).alias(feature)), fs)
    task = fs.label.task
    return decide_freeze(feature, drift_window, labels, live, frozen, now, policy, task)
