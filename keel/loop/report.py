"""How well the loop served a month, on realized labels, against two baselines — computed from the ledger and the
month's labelled features, so anyone can recompute it.

- **served**: each row is scored by the champion of the release that was live at noon UTC of its scheduled day
  (the ledger's ``live_from`` is simulated time in a live replay; traffic about day D's entities is sent during D);
  rows before the first release are left out, for all three;
- **static**: the first model (January–March), never replaced;
- **naive**: a model retrained every month without a gate, on the four months before (fitted on the first three,
  early-stopped on the fourth: the challenger's recipe) — retraining blindly;
- **expanding** (a reference, not a baseline the loop must beat): refitted at the month's start on all labelled
  history (the period's first month through the month before last, early-stopped on the last), serving from the
  month's first day — what the best simple policy would have done with no delay.

The baselines are refitted at the start of the month a row was *scored as of* (the entity's date: a flight's day, a
booking's quote), not of the month it belongs to: a hotel booking of August 2017 quoted in January is scored by the
naive model of January, fitted on what was labelled then — a model refitted in August would have learned from prices
that did not exist when the quote was made. A month with no baseline model (too early to refit) is scored by the
static model, what a team without a refit would serve. For flights the two months are the same.

All three are measured on the same rows, in the same serving periods (runs of days one model served), by the
metrics of the label's task (keel/metrics.py): for a binary label AUC within each period, weighted by its rows, and
log-loss over all of them; for a regression RMSE and MAE over all of them. Pure: models come in as text through
``load``; nothing here reads a clock or a file.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time

import numpy as np
import polars as pl

from keel.features.spec import FeatureSet
from keel.loop.concept import ConceptDrift, concept_drift
from keel.loop.estimate import Estimator, estimation_error
from keel.loop.shadow import clustered_mean_se
from keel.metrics import SUMMARY, auc, summary
from keel.training.model import feature_matrix, labelled_days, predict

NOON = time(12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Release:
    live_from: datetime
    release_id: str
    model_sha: str


@dataclass(frozen=True)
class Score:
    """A model's metrics on the month: name → value (None where undefined), the task's ``SUMMARY`` names."""

    metrics: dict[str, float | None]

    @classmethod
    def empty(cls, task: str) -> Score:
        return cls(dict.fromkeys(SUMMARY[task]))

    def __getattr__(self, name: str) -> float | None:  # score.auc, score.rmse, …
        try:
            return self.__dict__["metrics"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class MonthReport:
    month: str
    rows: int
    served: Score
    static: Score
    naive: Score
    served_by: dict[str, int] = field(default_factory=dict)  # model sha → rows it served this month
    expanding: Score | None = None  # the reference row (module docstring); None: not computed
    # A regression's served answers: the share whose label fell inside the prediction interval the serving version
    # carried (keel/intervals.py); None for a binary model or when no served version has an interval.
    interval_coverage: float | None = None
    # Each served version's quality as its estimator said it from the scores alone (keel/loop/estimate.py) beside the
    # realized value on the same rows: model sha → ``EstimateRecord``; versions with no estimator are left out.
    estimates: dict[str, EstimateRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class EstimateRecord:
    metric: str  # the task's headline: AUC, RMSE
    estimated: float
    se: float
    realized: float
    error: float  # estimated − realized for AUC, estimated / realized − 1 for RMSE
    held: bool  # within keel.loop.estimate.TOLERANCE
    rows: int
    # whether the estimator's assumption held on these rows' labels (keel/loop/concept.py): a miss with concept drift
    # is what no estimate before the labels can see; None: too few days to judge
    concept: ConceptDrift | None = None
    # how well these rows know the realized value itself: its standard error, clustered by day (a regression's RMSE;
    # None for AUC) — a month of few stays measures its RMSE to ±30 % and cannot tell a 10 % miss from its own noise
    realized_se: float | None = None

    @property
    def within_noise(self) -> bool:
        """Whether the estimate lies inside the realized value's own 95 % interval (the month cannot tell the miss
        from its sampling noise)."""
        return self.realized_se is not None and abs(self.estimated - self.realized) <= 1.96 * self.realized_se


def estimate_record(estimator: Estimator, task: str, parts: list[tuple[np.ndarray, ...]]):
    """The estimate from the scores (and features) of one version's rows, beside the realized value and the verdict
    on concept drift (``parts``: scores, labels, features, days); None when there are too few rows to estimate."""
    s, y, x, days = (np.concatenate([p[k] for p in parts]) for k in range(4))
    metric = SUMMARY[task][0]
    estimate = estimator.estimate(s, x).get(metric)
    realized = summary(task, s, y).get(metric)
    if estimate is None or realized is None or not np.isfinite(realized):
        return None
    error, held = estimation_error(metric, estimate.value, realized)
    concept = concept_drift(estimator, s, y, days, x)
    noise = realized_rmse_se(s, y, days) if metric == "rmse" else None
    return EstimateRecord(
        metric, estimate.value, estimate.se, float(realized), error, held, int(y.size), concept, noise
    )


def realized_rmse_se(scores: np.ndarray, labels: np.ndarray, days: np.ndarray) -> float | None:
    """The realized RMSE's standard error over these rows, clustered by day (the delta method on the mean squared
    error: se(RMSE) = se(MSE) / 2·RMSE); None with fewer than two days."""
    mse, se, g = clustered_mean_se((np.asarray(labels, float) - np.asarray(scores, float)) ** 2, days)
    if g < 2 or not np.isfinite(se) or mse <= 0:
        return None
    return float(se / (2 * np.sqrt(mse)))


def champion_at(releases: list[Release], when: datetime) -> Release | None:
    """The release live at ``when`` (the latest with live_from ≤ when), or None before the first."""
    starts = [r.live_from for r in releases]
    i = bisect.bisect_right(starts, when)
    return releases[i - 1] if i else None


def segments(frame: pl.DataFrame, releases: list[Release], fs: FeatureSet) -> list[tuple[str, pl.DataFrame]]:
    """The month's labelled rows of the feature table of ``fs`` in serving periods: (model sha, its rows) for each
    run of consecutive days served by one model. Rows before the first release are left out (nothing served them)."""
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


def segment_score(parts: list[tuple[np.ndarray, np.ndarray]], task: str = "binary") -> Score:
    """The task's metrics over every serving period's rows; AUC (binary) within each period, weighted by its rows
    (a ranking is judged among rows one model scored: pooling two models' scores would count their calibration gap
    as misranking)."""
    parts = [(s, y) for s, y in parts if y.size]
    if not parts:
        return Score.empty(task)
    s, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    metrics = summary(task, s, y)
    if "auc" in metrics:
        aucs = [(auc(s, y), y.size) for s, y in parts]
        aucs = [(a, n) for a, n in aucs if np.isfinite(a)]
        metrics["auc"] = sum(a * n for a, n in aucs) / sum(n for _, n in aucs) if aucs else None
    return Score(metrics)


Baseline = Callable[[str], str | None]  # a month scored as of (YYYY-MM) → the baseline model refitted at its start


def by_scoring_month(
    part: pl.DataFrame, fs: FeatureSet, model_of: Baseline, fallback: str
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, labels) of ``part``'s rows, each scored by the model of the month it is scored as of (the entity's
    date), ``fallback`` where that month has none."""
    months = part[fs.entity.date].dt.strftime("%Y-%m")
    scored = [predict(model_of(m) or fallback, part.filter(months == m), fs) for m in months.unique().sort()]
    return np.concatenate([s for s, _ in scored]), np.concatenate([y for _, y in scored])


def month_report(
    month: str,
    frame: pl.DataFrame,
    releases: list[Release],
    load: Callable[[str], str],
    static_text: str,
    naive: Baseline | None,
    fs: FeatureSet,
    expanding: Baseline | None = None,
    half_width: Callable[[str], float | None] = lambda sha: None,
    estimator: Callable[[str], Estimator | None] = lambda sha: None,
) -> MonthReport:
    """The models on the same rows — those a release served — in the same serving periods, by the metrics of the
    task of ``fs``'s label; the baselines refitted at the start of each row's scoring month (module docstring).
    ``half_width``: a version's prediction-interval half-width by sha256 (None: it has none), for the realized
    coverage of what was served; ``estimator``: a version's quality estimator by sha256 (None: it has none), for the
    estimate of what was served beside its realized value."""
    task = fs.label.task
    parts = segments(frame, releases, fs)
    served, static, naive_parts, reference_parts, counts, covered = [], [], [], [], {}, []
    estimated: dict[str, list] = {}
    for sha, part in parts:
        served.append(predict(load(sha), part, fs))
        static.append(predict(static_text, part, fs))
        if naive:
            naive_parts.append(by_scoring_month(part, fs, naive, static_text))
        if expanding:
            reference_parts.append(by_scoring_month(part, fs, expanding, static_text))
        counts[sha] = counts.get(sha, 0) + int(served[-1][1].size)
        if (q := half_width(sha)) is not None and served[-1][1].size:
            scores, labels = served[-1]
            covered.append((int(np.sum(np.abs(labels - scores) <= q)), int(labels.size)))
        if estimator(sha) is not None:
            estimated.setdefault(sha, []).append((*served[-1], feature_matrix(part, fs), labelled_days(part, fs)))
    rows = sum(int(y.size) for _, y in served)
    naive_score = segment_score(naive_parts, task) if naive else Score.empty(task)
    reference = segment_score(reference_parts, task) if expanding else Score.empty(task)
    coverage = sum(c for c, _ in covered) / sum(n for _, n in covered) if covered else None
    estimates = {sha: estimate_record(estimator(sha), task, p) for sha, p in estimated.items()}
    return MonthReport(
        month,
        rows,
        segment_score(served, task),
        segment_score(static, task),
        naive_score,
        counts,
        reference,
        coverage,
        {sha: e for sha, e in estimates.items() if e is not None},
    )


def expanding_window(month: str, months: tuple[str, ...]) -> tuple[tuple[str, ...], str] | None:
    """The expanding reference's window for ``month``: every month of ``months`` before it, fitted on all but the
    last, early-stopped on the last; None when fewer than two come before it."""
    earlier = [m for m in months if m < month]
    if len(earlier) < 2:
        return None
    return tuple(earlier[:-1]), earlier[-1]


def month_end(month: str) -> datetime:
    """The first instant after ``month`` (UTC)."""
    year, m = (int(x) for x in month.split("-"))
    return datetime(year + (m == 12), m % 12 + 1, 1, tzinfo=UTC)


def days_after(month: str | None, simulated: str) -> float | None:
    """Days from the end of ``month`` (the month whose labels a decision rests on: its gate month) to the decision's
    simulated time (ISO); None when either is unknown."""
    if not month or not simulated:
        return None
    return round((datetime.fromisoformat(simulated) - month_end(month)).total_seconds() / 86400, 1)


@dataclass(frozen=True)
class Promotion:
    """A release that put a loop-trained model live, and the drift that caused it."""

    live_from: datetime
    release_id: str
    version: int
    drift_window: str | None  # the month whose drift report asked for the model (None: not the loop's)

    @property
    def delay_days(self) -> float | None:
        """Days from the end of the drift's month to this release (None when no drift caused it)."""
        if not self.drift_window:
            return None
        return (self.live_from - month_end(self.drift_window)).total_seconds() / 86400


def naive_window(
    month: str, window_months: int = 4, months: tuple[str, ...] | None = None
) -> tuple[tuple[str, ...], str] | None:
    """The naive baseline's window for ``month``, the challenger's recipe without its gate: the ``window_months``
    before it among ``months`` (the use case's; default: its calendar year's), fitted on all but the last,
    early-stopped on the last; None when fewer than two months come before it."""
    if months is None:
        year = int(month[:4])
        months = tuple(f"{year}-{k:02d}" for k in range(1, 13))
    earlier = [m for m in months if m < month]
    before = earlier[-window_months:]
    if len(before) < 2:
        return None
    return tuple(before[:-1]), before[-1]
