"""How well the loop served a month, on realized labels, against two baselines — computed from the ledger and the
month's labelled features, so anyone can recompute it.

- **served**: each row is scored by the champion of the release that was live at noon UTC of its scheduled day
  (the ledger's ``live_from`` is simulated time in a live replay; traffic about day D's entities is sent during D);
  rows before the first release are left out, for all three;
- **static**: the first model (January–March), never replaced;
- **naive**: a model retrained every month without a gate, on the four months before (fitted on the first three,
  early-stopped on the fourth: the challenger's recipe) — retraining blindly.

All three are measured on the same rows, in the same serving periods (runs of days one model served): AUC within
each period, weighted by its rows; log-loss over all of them. Pure: models come in as text through ``load``;
nothing here reads a clock or a file.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time

import numpy as np
import polars as pl

from keel.training.model import auc, log_loss, predict
from keel.usecase import only

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
    served_by: dict[str, int] = field(default_factory=dict)  # model sha → rows it served this month


def champion_at(releases: list[Release], when: datetime) -> Release | None:
    """The release live at ``when`` (the latest with live_from ≤ when), or None before the first."""
    starts = [r.live_from for r in releases]
    i = bisect.bisect_right(starts, when)
    return releases[i - 1] if i else None


def segments(frame: pl.DataFrame, releases: list[Release]) -> list[tuple[str, pl.DataFrame]]:
    """The month's labelled rows in serving periods: (model sha, its rows) for each run of consecutive days
    served by one model. Rows before the first release are left out (nothing served them)."""
    fs = only().features  # issue 30: the one installed use case's table (threaded with the loop's metrics next)
    day = fs.entity.date
    labelled = frame.filter(pl.col(fs.label.column).is_not_null())
    out: list[tuple[str, list]] = []
    for d in labelled[day].unique().sort().to_list():
        r = champion_at(releases, datetime.combine(d if isinstance(d, date) else d.date(), NOON))
        if r is None:
            continue
        if out and out[-1][0] == r.model_sha:
            out[-1][1].append(d)
        else:
            out.append((r.model_sha, [d]))
    return [(sha, labelled.filter(pl.col(day).is_in(days))) for sha, days in out]


def segment_score(parts: list[tuple[np.ndarray, np.ndarray]]) -> Score:
    """AUC within each serving period, weighted by its rows (a ranking is judged among rows one model
    scored: pooling two models' scores would count their calibration gap as misranking); log-loss over all."""
    parts = [(s, y) for s, y in parts if y.size]
    if not parts:
        return Score(None, None)
    aucs = [(auc(s, y), y.size) for s, y in parts]
    aucs = [(a, n) for a, n in aucs if np.isfinite(a)]
    weighted = sum(a * n for a, n in aucs) / sum(n for _, n in aucs) if aucs else None
    s, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return Score(weighted, log_loss(s, y))


def month_report(
    month: str,
    frame: pl.DataFrame,
    releases: list[Release],
    load: Callable[[str], str],
    static_text: str,
    naive_text: str | None,
) -> MonthReport:
    """The three models on the same rows — those a release served — in the same serving periods."""
    parts = segments(frame, releases)
    served, static, naive, counts = [], [], [], {}
    for sha, part in parts:
        served.append(predict(load(sha), part))
        static.append(predict(static_text, part))
        if naive_text:
            naive.append(predict(naive_text, part))
        counts[sha] = counts.get(sha, 0) + int(served[-1][1].size)
    rows = sum(int(y.size) for _, y in served)
    naive_score = segment_score(naive) if naive_text else Score(None, None)
    return MonthReport(month, rows, segment_score(served), segment_score(static), naive_score, counts)


def naive_window(month: str, window_months: int = 4) -> tuple[tuple[str, ...], str] | None:
    """The naive baseline's window for ``month``, the challenger's recipe without its gate: the ``window_months``
    before it (as many as the year has), fitted on all but the last, early-stopped on the last; None before March."""
    year, m = (int(x) for x in month.split("-"))
    before = [f"{year}-{k:02d}" for k in range(max(1, m - window_months), m)]
    if len(before) < 2:
        return None
    return tuple(before[:-1]), before[-1]
