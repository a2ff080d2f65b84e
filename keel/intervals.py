"""What a regression answer is sure of: a split-conformal prediction interval and the confidence derived from it.

A binary model's confidence is |2·p − 1| (how far its probability is from a coin toss); a regression answer is a
value in the label's units, so |2·ŷ − 1| means nothing (a 120 EUR quote would be "239 confident"). A regression
model instead carries a **prediction interval** at a declared coverage (``ModelSpec.interval_coverage``, default
90 %): with ``n`` validation rows the model was not fitted on and their absolute residuals |y − ŷ| sorted, the
half-width ``q`` is the ⌈(n + 1)·coverage⌉-th smallest (split conformal: for a new row from the same distribution,
y falls in [ŷ − q, ŷ + q] with probability ≥ coverage). ``q`` is computed once, when the model is registered, on its
validation rows, stored in its registry record (``interval``) and released with it; drift breaks the guarantee,
which is why ``loop_report`` measures the realized coverage of each month.

The confidence in [0, 1] of a regression answer is **1 − 2q / spread**, clipped to [0, 1], where ``spread`` is the
width of the label's usual range — its 5th to 95th percentile on the calibration rows, recorded with the interval:
the share of that range the interval rules out. 0 means the interval is as wide as the labels' own range (the model
says no more than "a usual value"); near 1, it pins the answer to a sliver of it. It is the same for every answer
of a version: a split-conformal interval has one width, so it says nothing about one answer over another, and
neither does its confidence (the former 1 − q/|ŷ| ranked answers by |ŷ| alone and was 0 whenever |ŷ| ≤ q — every
answer near zero, e.g. a count of bikes at night; issue 61 item 7). A version recorded without a spread claims 0.

A label's **domain** (``keel.features.spec.LabelDomain``: bounds, whole numbers) holds answers and intervals to
values the label can take: the score clipped into it, the interval's ends clipped (and rounded inwards to whole
numbers for an integer label) — a count's interval never goes below 0. Clipping to the domain removes only
impossible values: the coverage is unchanged.

A coarse model's answer uses the coarse model's own interval; the policy's last-resort score (a constant, no model)
has confidence 0 and no interval.

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
    label_spread: float | None = None  # the calibration labels' 5th–95th percentile width (the confidence's scale)

    def as_metadata(self) -> dict[str, Any]:
        return {
            "coverage": self.coverage, "half_width": self.half_width, "calibration_rows": self.calibration_rows,
            "calibrated_on": self.calibrated_on, "method": "split conformal, absolute residuals",
            "label_spread": self.label_spread,
        }  # fmt: skip

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> Interval | None:
        """The interval in a registry record's metadata, or None when it has none (a binary model, an older one)."""
        d = metadata.get(INTERVAL_KEY)
        if not d:
            return None
        spread = d.get("label_spread")
        return cls(
            float(d["coverage"]),
            float(d["half_width"]),
            int(d["calibration_rows"]),
            str(d["calibrated_on"]),
            None if spread is None else float(spread),
        )


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
    labels = np.asarray(labels, dtype=np.float64)
    residuals = labels - np.asarray(scores, dtype=np.float64)
    return Interval(
        check_coverage(coverage),
        conformal_half_width(residuals, coverage),
        int(residuals.size),
        calibrated_on,
        label_spread(labels),
    )


def label_spread(labels: np.ndarray) -> float:
    """The width of the labels' usual range: their 95th minus their 5th percentile."""
    lo, hi = np.quantile(np.asarray(labels, dtype=np.float64), [0.05, 0.95])
    return float(hi - lo)


def clip_scores(scores: np.ndarray, domain=None) -> np.ndarray:
    """``scores`` held to the label's ``domain`` (``LabelDomain``; None: unchanged)."""
    s = np.asarray(scores, dtype=np.float64)
    if domain is None:
        return s
    return np.clip(
        s, -np.inf if domain.lower is None else domain.lower, np.inf if domain.upper is None else domain.upper
    )


def bounds(scores: np.ndarray, half_width: float, domain=None) -> tuple[np.ndarray, np.ndarray]:
    """ŷ ± half-width, held to the label's ``domain`` (its bounds; whole numbers inwards for an integer label)."""
    s = np.asarray(scores, dtype=np.float64)
    lo, hi = s - half_width, s + half_width
    if domain is None:
        return lo, hi
    if domain.integer:
        lo, hi = np.ceil(lo - 1e-9), np.floor(hi + 1e-9)
    return clip_scores(lo, domain), clip_scores(hi, domain)


def confidence(scores: np.ndarray, half_width: float, spread: float | None) -> np.ndarray:
    """1 − 2·half_width / spread, clipped to [0, 1], for each of ``scores`` (module docstring); 0 without a spread."""
    n = np.asarray(scores).shape
    if spread is None or not spread > 0:
        return np.zeros(n)
    return np.full(n, min(1.0, max(0.0, 1.0 - 2.0 * half_width / spread)))


# a month's realized coverage this far from the declared one is a month the interval misled (issue 61 item 6)
COVERAGE_TOLERANCE = 0.03


def coverage_held(realized: float | None, declared: float, tolerance: float = COVERAGE_TOLERANCE) -> tuple[bool, str]:
    """Whether a month's served answers were covered as declared: ``realized`` (the share of their labels inside
    the interval they carried; None without one) within ``tolerance`` of ``declared`` — and the reason, in words.
    Below it, the interval promised more than it held; above it, it was wider than it needed. Drift breaks the
    conformal guarantee (bench/coverage.py: every served month of hotels and a third table drifted, and missed)."""
    if realized is None:
        return True, "no labelled answer carried an interval this month"
    said = (
        f"{realized:.1%} of the month's labels fell inside the interval their answer carried, declared {declared:.0%}"
    )
    gap = realized - declared
    if round(abs(gap), 9) <= tolerance:  # 0.93 − 0.9 is 0.030000000000000027 in floating point: held
        return True, said
    side = "below: the interval promised more than it held" if gap < 0 else "above: it was wider than it needed"
    return False, f"{said} — {abs(gap) * 100:.1f} points {side} (the month drifted from the calibration's?)"


def realized_coverage(scores: np.ndarray, labels: np.ndarray, half_width: float) -> float | None:
    """The share of rows whose label fell inside ŷ ± half_width (None without rows)."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if s.size == 0:
        return None
    return float(np.mean(np.abs(y - s) <= half_width))
