"""Which of several candidates, if any, replaces the champion (issue 32: better candidates).

A drift decision trains more than one candidate (a rolling window, the expanding window of all labelled history, one
with recency weights, a committee of the first model and the newest expanding refits, a recalibrated champion, and for
a regression label the expanding window fitted to the median: ``robust``). Each is compared with the champion on the same labelled rows by the
shadow verdict's paired, cluster-robust test (keel/loop/shadow.py). Comparing k candidates and keeping the best is k
chances to be fooled, so the family is corrected with Holm's step-down method: sort the one-sided p-values, accept
the i-th smallest as "surely better" only while p_(i) ≤ α / (k − i + 1). Among the candidates that remain surely
better, the first of ``prefer`` (the committee, by default) is chosen, else the one with the lowest mean loss
difference; none: the champion stays.

Why a preference and not simply the lowest difference: the gate judges on the newest labelled days, and which
candidate fits those best says little about the month it will serve. Measured on 2013 (docs/live.md, "The bar,
measured offline"): the recency-weighted candidate wins the gate in July and October — it is the most like the days
just gone — and serves the next months worse than the committee (May–December 0.6919 AUC / 0.5092 log-loss against
0.7009 / 0.4991); with every chosen candidate serving from day 11 of its month (scripts/loop_chain.py, the gate on
days 22–end), the loop that takes the lowest difference serves 0.6940 / 0.4984, the one that prefers a surely-better
committee 0.6957 / 0.4967. The preference changes nothing about *whether* a candidate is surely better —
that stays Holm's — only which of several surely-better ones is tried.

Pure: ``choose_candidate`` returns the table (one row per candidate, for the gate's metadata in the UI) and the
choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from keel.loop.shadow import DEFAULT_SHADOW, ShadowPolicy, ShadowVerdict, shadow_verdict
from keel.usecase_parts import DEFAULT_RECIPES

RECENCY_HALF_LIFE_DAYS = 60.0  # the recency-weighted candidate: a row two months older counts half
ROBUST_OBJECTIVE = (
    "regression_l1"  # the robust candidate's loss: LightGBM's absolute error, whose best answer is the median
)
PREFER = ("committee",)  # among surely-better candidates, these first (in this order); then the lowest difference


@dataclass(frozen=True)
class CandidateSpec:
    """One candidate a drift decision trains: a window of months (with recency weights when ``half_life_days``;
    ``expanding`` when it is all labelled history), or — ``recalibrate`` — the champion's own trees with their output
    refitted to the newest labelled days, or — ``committee`` — the mean raw score of the use case's own trained model
    and the expanding refits of this decision and the one before (keel/loop/committee.py); ``objective``: a LightGBM
    objective in place of the use case's (the robust candidate's)."""

    name: str
    train_months: tuple[str, ...] = ()
    half_life_days: float | None = None
    recalibrate: bool = False
    expanding: bool = False
    committee: bool = False
    objective: str | None = None

    def describe(self) -> str:
        if self.recalibrate:
            return "the champion, recalibrated on the newest labelled days"
        if self.committee:
            return "the mean of the first model and the newest expanding refits (its record names the members)"
        window = f"{self.train_months[0]}…{self.train_months[-1]}" if len(self.train_months) > 1 else \
            self.train_months[0]  # fmt: skip
        weights = f", recency weights (half-life {self.half_life_days:g} days)" if self.half_life_days else ""
        loss = ", to the median (absolute error)" if self.objective == ROBUST_OBJECTIVE else ""
        return f"fitted on {window}{weights}{loss}"


def candidate_specs(
    rolling: tuple[str, ...], period: tuple[str, ...], label_drift: bool, recipes: tuple[str, ...] = DEFAULT_RECIPES
) -> list[CandidateSpec]:
    """The candidates of one drift decision: ``rolling`` (the plan's window of recent months), ``expanding`` (every
    month of the use case's ``period`` from its first through the rolling window's last: all labelled history),
    ``recency`` (the expanding window, newer rows weighing more), ``committee`` (the first model and the expanding
    refits averaged: fitted after the others, from them), when the drift report found the label drifted,
    ``recalibrated`` (the champion with its output refitted: cheap, and right when only the base rate moved) and
    ``robust`` (the expanding window fitted to the median: a regression's few very large labels do not pull every
    answer towards them — the use case lists it only for a regression label, keel/usecase.py checks). The
    candidate fitted on the expanding window is marked ``expanding`` (the rolling one when the two windows are the
    same): the committee's member, now and at the next decision. Only the ``recipes`` the use case lists (its
    ``Loop.candidates``) are trained."""
    if not rolling:
        raise ValueError("the rolling window is empty: a candidate needs months to be fitted on")
    expanding = tuple(m for m in period if m <= rolling[-1]) or rolling
    specs = []
    if "rolling" in recipes:
        specs.append(CandidateSpec("rolling", rolling, expanding=expanding == rolling))
    if "expanding" in recipes and (expanding != rolling or "rolling" not in recipes):
        specs.append(CandidateSpec("expanding", expanding, expanding=True))
    if "recency" in recipes:
        specs.append(CandidateSpec("recency", expanding, RECENCY_HALF_LIFE_DAYS))
    if "committee" in recipes:
        specs.append(CandidateSpec("committee", expanding, committee=True))
    if label_drift and "recalibrated" in recipes:
        specs.append(CandidateSpec("recalibrated", recalibrate=True))
    if "robust" in recipes:
        specs.append(CandidateSpec("robust", expanding, objective=ROBUST_OBJECTIVE))
    return specs


@dataclass(frozen=True)
class CandidateRow:
    name: str
    verdict: ShadowVerdict
    holm_alpha: float | None  # the level its p-value was held to (None: not tested, or the step-down stopped before)
    surely_better: bool
    chosen: bool = False

    def as_row(self) -> dict:
        v = self.verdict
        return {
            "candidate": self.name, "labelled": v.labelled, "days": v.clusters, "delta": v.delta, "se": v.se,
            "p_value": v.p_value, "holm_alpha": self.holm_alpha, "surely_better": self.surely_better,
            "chosen": self.chosen, "reason": v.reason,
        }  # fmt: skip


@dataclass(frozen=True)
class CandidateChoice:
    chosen: str | None
    reason: str
    rows: tuple[CandidateRow, ...]


def holm(p_values: dict[str, float | None], alpha: float) -> dict[str, tuple[float | None, bool]]:
    """name → (the level its p-value was held to, rejected) under Holm's step-down at family level ``alpha``; a
    None p-value (not testable) is never rejected and stops nothing."""
    tested = sorted(((p, name) for name, p in p_values.items() if p is not None), key=lambda x: (x[0], x[1]))
    k = len(tested)
    out: dict[str, tuple[float | None, bool]] = {name: (None, False) for name in p_values}
    for i, (p, name) in enumerate(tested):
        level = alpha / (k - i)
        if p > level:
            out[name] = (level, False)
            break  # every larger p-value is accepted as well
        out[name] = (level, True)
    return out


def choose_candidate(
    labels: np.ndarray,
    champion_scores: np.ndarray,
    candidates: dict[str, np.ndarray],
    clusters: np.ndarray,
    policy: ShadowPolicy = DEFAULT_SHADOW,
    task: str = "binary",
    prefer: tuple[str, ...] = PREFER,
) -> CandidateChoice:
    """The candidate to put into the canary (or None), with one table row per candidate: the first of ``prefer``
    that is surely better, else the surely-better one with the lowest mean loss difference."""
    if not candidates:
        return CandidateChoice(None, "no candidate was trained", ())
    verdicts = {
        name: shadow_verdict(labels, champion_scores, scores, clusters, policy, task)
        for name, scores in candidates.items()
    }
    tested = holm({name: v.p_value for name, v in verdicts.items()}, policy.alpha)
    rows = [CandidateRow(name, v, *tested[name]) for name, v in verdicts.items()]
    better = [r for r in rows if r.surely_better]
    if not better:
        best = min(rows, key=lambda r: (r.verdict.delta is None, r.verdict.delta or 0.0))
        return CandidateChoice(
            None,
            f"none of {len(rows)} candidates is surely better than the champion after Holm's correction "
            f"(closest: {best.name}: {best.verdict.reason})",
            tuple(rows),
        )
    preferred = [r for name in prefer for r in better if r.name == name]
    winner = preferred[0] if preferred else min(better, key=lambda r: r.verdict.delta)
    rows = [replace(r, chosen=r is winner) for r in rows]
    why = " (preferred when surely better)" if preferred and len(better) > 1 else ""
    return CandidateChoice(
        winner.name,
        f"{winner.name}{why}: {winner.verdict.reason}; {len(better)} of {len(rows)} candidates surely better "
        f"(Holm, family α {policy.alpha})",
        tuple(rows),
    )
