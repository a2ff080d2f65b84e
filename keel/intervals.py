"""What a regression answer is sure of: a split-conformal prediction interval and the confidence derived from it.

A binary model's confidence is |2·p − 1| (how far its probability is from a coin toss); a regression answer is a
value in the label's units, so |2·ŷ − 1| means nothing (a 120 EUR quote would be "239 confident"). A regression
model instead carries a **prediction interval** at a declared coverage (``ModelSpec.interval_coverage``, default
90 %): with ``n`` validation rows the model was not fitted on and their absolute residuals |y − ŷ| sorted, the
half-width ``q`` is the ⌈(n + 1)·coverage⌉-th smallest (split conformal: for a new row from the same distribution,
y falls in [ŷ − q, ŷ + q] with probability ≥ coverage). ``q`` is computed once, when the model is registered, on its
validation rows, stored in its registry record (``interval``) and released with it; drift breaks the guarantee,
which is why ``loop_report`` measures the realized coverage of each month.

The confidence in [0, 1] of a regression answer is 1 − q / |ŷ|, clipped to [0, 1]: the share of the answer the
interval leaves standing (a 120 EUR quote ± 30 EUR: 0.75; an interval wider than the answer itself: 0). A coarse
model's answer uses the coarse model's own interval; the policy's last-resort score (a constant, no model) has
confidence 0 and no interval.

Pure numpy: the gateway, the training assets and the loop's report share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

INTERVAL_KEY = "interval"  # where a registry record keeps its interval
DEFAULT_COVERAGE = 0.9


@dataclass(frozen=True)
class Interval:
    """A model's split-conformal interval: ŷ ± ``half_width`` covers ``coverage`` of rows like its calibration's."""

    coverage: float
    half_width: float
    calibration_rows: int
    calibrated_on: str  # the validation rows it was computed on, in words (e.g. "2016-03", "2016-05 days 1–21")

    def as_metadata(self) -> dict[str, Any]:
        return {
            "coverage": self.coverage, "half_width": self.half_width, "calibration_rows": self.calibration_rows,
            "calibrated_on": self.calibrated_on, "method": "split conformal, absolute residuals",
        }  # fmt: skip

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> Interval | None:
        """The interval in a registry record's metadata, or None when it has none (a binary model, an older one)."""
        d = metadata.get(INTERVAL_KEY)
        if not d:
            return None
        return cls(float(d["coverage"]), float(d["half_width"]), int(d["calibration_rows"]), str(d["calibrated_on"]))


def check_coverage(coverage: float) -> float:
    if not (isinstance(coverage, int | float) and 0.5 <= coverage < 1):
        raise ValueError(f"interval coverage {coverage!r}: must be in [0.5, 1)")
    return float(coverage)


def conformal_half_width(residuals: np.ndarray, coverage: float) -> float:
    """The ⌈(n + 1)·coverage⌉-th smallest |residual| of ``n`` calibration rows. Too few rows for the coverage (that
    rank past n: the interval would be infinite) is an error that says how many it needs."""
    check_coverage(coverage)
    r = np.sort(np.abs(np.asarray(residuals, dtype=np.float64)))
    if not np.isfinite(r).all():
        raise ValueError("a calibration residual is not finite: the model or a label is broken")
    n = r.size
    rank = math.ceil((n + 1) * coverage)
    if rank > n:
        need = math.ceil(coverage / (1 - coverage))
        raise ValueError(f"{n} calibration rows are too few for a {coverage:.0%} interval (at least {need})")
    return float(r[rank - 1])


def fit(scores: np.ndarray, labels: np.ndarray, coverage: float, calibrated_on: str) -> Interval:
    """The interval of a model that scored ``scores`` on calibration rows whose labels are ``labels``."""
    residuals = np.asarray(labels, dtype=np.float64) - np.asarray(scores, dtype=np.float64)
    return Interval(check_coverage(coverage), conformal_half_width(residuals, coverage), int(residuals.size),
                    calibrated_on)  # fmt: skip


def bounds(scores: np.ndarray, half_width: float) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    return s - half_width, s + half_width


def confidence(scores: np.ndarray, half_width: float) -> np.ndarray:
    """1 − half_width / |ŷ|, clipped to [0, 1] (module docstring); 0 where ŷ is 0."""
    s = np.abs(np.asarray(scores, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(s > 0, 1.0 - half_width / s, 0.0)
    return np.clip(c, 0.0, 1.0)


def realized_coverage(scores: np.ndarray, labels: np.ndarray, half_width: float) -> float | None:
    """The share of rows whose label fell inside ŷ ± half_width (None without rows)."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if s.size == 0:
        return None
    return float(np.mean(np.abs(y - s) <= half_width))
