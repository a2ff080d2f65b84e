"""How well the loop served a month, on realized labels, against two baselines — computed from the ledger and the
month's labelled features, so anyone can recompute it.

- **served**: each flight is scored by the champion of the release that was live at noon UTC of its scheduled day
  (the ledger's ``live_from`` is simulated time in a live replay; traffic about day D's flights is sent during D);
- **static**: the first model (January–March), never replaced;
- **naive**: a model retrained every month without a gate, on the four months before (fitted on the first three,
  early-stopped on the fourth: the challenger's recipe) — retraining blindly.

Pure: models come in as text through ``load``; nothing here reads a clock or a file.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time

import numpy as np
import polars as pl

from keel.training.model import auc, log_loss, predict

NOON = time(12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Release:
    live_from: datetime
    release_id: str
    model_sha: str


@dataclass(frozen=True)
class Score:
    auc: float | None
    log_loss: float | None


@dataclass(frozen=True)
class MonthReport:
    month: str
    rows: int
    served: Score
    static: Score
    naive: Score
    served_by: dict[str, int] = field(default_factory=dict)  # model sha → flights it served this month


def champion_at(releases: list[Release], when: datetime) -> Release | None:
    """The release live at ``when`` (the latest with live_from ≤ when), or None before the first."""
    starts = [r.live_from for r in releases]
    i = bisect.bisect_right(starts, when)
    return releases[i - 1] if i else None


def _score(scores: np.ndarray, labels: np.ndarray) -> Score:
    if labels.size == 0:
        return Score(None, None)
    a = auc(scores, labels)
    return Score(None if not np.isfinite(a) else a, log_loss(scores, labels))


def served_scores(
    frame: pl.DataFrame, releases: list[Release], load: Callable[[str], str]
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(scores, labels, flights per model) of the labelled flights of ``frame``, each scored by the model that
    served its day. Flights before the first release are left out (nothing served them)."""
    labelled = frame.filter(pl.col("label_late15").is_not_null())
    days = labelled["sched_date"].unique().sort().to_list()
    by_day = {}
    for d in days:
        r = champion_at(releases, datetime.combine(d if isinstance(d, date) else d.date(), NOON))
        if r is not None:
            by_day[d] = r.model_sha
    scores, labels, counts = [], [], {}
    for sha in sorted(set(by_day.values())):
        part = labelled.filter(pl.col("sched_date").is_in([d for d, s in by_day.items() if s == sha]))
        s, y = predict(load(sha), part)
        scores.append(s)
        labels.append(y)
        counts[sha] = int(y.size)
    if not scores:
        return np.array([]), np.array([]), {}
    return np.concatenate(scores), np.concatenate(labels), counts


def month_report(
    month: str,
    frame: pl.DataFrame,
    releases: list[Release],
    load: Callable[[str], str],
    static_text: str,
    naive_text: str | None,
) -> MonthReport:
    s, y, counts = served_scores(frame, releases, load)
    static_s, static_y = predict(static_text, frame)
    naive = _score(*predict(naive_text, frame)) if naive_text else Score(None, None)
    return MonthReport(month, int(static_y.size), _score(s, y), _score(static_s, static_y), naive, counts)


def naive_window(month: str, window_months: int = 4) -> tuple[tuple[str, ...], str] | None:
    """The naive baseline's window for ``month``, the challenger's recipe without its gate: the ``window_months``
    before it (as many as the year has), fitted on all but the last, early-stopped on the last; None before March."""
    year, m = (int(x) for x in month.split("-"))
    before = [f"{year}-{k:02d}" for k in range(max(1, m - window_months), m)]
    if len(before) < 2:
        return None
    return tuple(before[:-1]), before[-1]
