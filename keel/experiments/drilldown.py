"""Root-cause drill-down: where a metric's change is concentrated.

The change Δ = mean(treatment) − mean(control) (or after − before) — when it is significant at all; otherwise there
is nothing to explain and the drill-down says so — is a sum over segments of
contribution(s) = w(s) · δ(s), with w(s) the segment's share of units and δ(s) its own change; a segment's share of
the change is contribution(s) / Δ. Starting from everything, at each level the drill-down looks at the segments of
every dimension not used yet (within the path so far), takes the one with the largest contribution in the
direction of Δ, and descends into it — while its contribution is significant (z-test on w·δ with δ's Welch standard
error, level α), the effect is *concentrated* there (δ inside differs from δ in the rest of the parent segment, z-test
at level α: a uniform effect is not blamed on whichever segment is largest) and its support (units in both arms) is
at least ``min_support``. It works on the cube that
``analysis.aggregate`` produced (one row per variant × cell), so each level costs a group-by over a few hundred rows.

The result reads: "the drop in accepted is concentrated in carrier=EV × origin=EWR (72 % of the change,
n = 41,200, 95 % CI of the share 61 %–83 %)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from scipy import stats

from keel.experiments.stats import Moments

COLS = ("n", "sy", "syy")


@dataclass(frozen=True)
class Step:
    dimension: str
    value: Any
    contribution: float  # w · δ, in the metric's units (per unit of the whole population)
    contribution_ci: tuple[float, float]
    share: float  # of the observed total change
    share_ci: tuple[float, float]  # the contribution's interval over the observed total
    z: float
    n: int  # units in both arms within the segment (the path so far included)
    segment_diff: float  # δ(s): the segment's own change
    alternatives: list[dict[str, Any]] = field(default_factory=list)  # the next best segments at this level


@dataclass(frozen=True)
class DrillDown:
    metric: str
    total_diff: float
    total_se: float
    steps: tuple[Step, ...]
    explanation: str
    stopped_because: str

    @property
    def path(self) -> dict[str, Any]:
        return {s.dimension: s.value for s in self.steps}

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "total_diff": self.total_diff,
            "total_se": self.total_se,
            "path": {str(k): v for k, v in self.path.items()},
            "steps": [{**s.__dict__, "share_ci": list(s.share_ci)} for s in self.steps],
            "explanation": self.explanation,
            "stopped_because": self.stopped_because,
        }


def _arm(rows: pl.DataFrame, variant_col: str, label: str, metric: str) -> Moments:
    r = rows.filter(pl.col(variant_col) == label)
    if r.is_empty():
        return Moments(0, 0.0, 0.0)
    return Moments(int(r[f"{metric}__n"].sum()), float(r[f"{metric}__sy"].sum()), float(r[f"{metric}__syy"].sum()))


def _minus(a: Moments, b: Moments) -> Moments:
    return Moments(a.n - b.n, a.sy - b.sy, a.syy - b.syy)


def _diff(c: Moments, t: Moments) -> tuple[float, float]:
    if c.n < 2 or t.n < 2:
        return math.nan, math.nan
    return t.mean - c.mean, math.sqrt(c.var / c.n + t.var / t.n)


def drilldown(
    cube: pl.DataFrame,
    variant_col: str,
    control: str,
    treatment: str,
    dimensions: tuple[str, ...] | list[str],
    metric: str,
    *,
    min_support: int = 200,
    alpha: float = 0.05,
    max_depth: int | None = None,
) -> DrillDown:
    z_crit = float(stats.norm.ppf(1 - alpha / 2))
    c_all, t_all = _arm(cube, variant_col, control, metric), _arm(cube, variant_col, treatment, metric)
    total, total_se = _diff(c_all, t_all)
    n_total = c_all.n + t_all.n
    steps: list[Step] = []
    remaining = list(dimensions)
    current = cube
    why = "no dimensions to split by"
    if not math.isfinite(total) or total == 0:
        return DrillDown(metric, total, total_se, (), f"{metric}: no change to explain", "no change")
    if total_se > 0 and abs(total) / total_se < z_crit:
        return DrillDown(
            metric, total, total_se, (),
            f"{metric}: the change ({total:+.4g}, z = {total / total_se:.2f}) is not significant; nothing to explain",
            "the total change is not significant",
        )  # fmt: skip
    sign = 1.0 if total > 0 else -1.0
    while remaining and (max_depth is None or len(steps) < max_depth):
        candidates = []
        parent_c, parent_t = (
            _arm(current, variant_col, control, metric),
            _arm(current, variant_col, treatment, metric),
        )
        for dim in remaining:
            seg = current.group_by(variant_col, dim).agg(pl.col(f"{metric}__{c}").sum() for c in COLS)
            for value in seg[dim].unique().to_list():
                rows = seg.filter(pl.col(dim) == value) if value is not None else seg.filter(pl.col(dim).is_null())
                c, t = _arm(rows, variant_col, control, metric), _arm(rows, variant_col, treatment, metric)
                d, se = _diff(c, t)
                if not math.isfinite(d):
                    continue
                w = (c.n + t.n) / n_total
                contrib, contrib_se = w * d, w * se
                z = sign * contrib / contrib_se if contrib_se > 0 else (math.inf if sign * contrib > 0 else 0.0)
                d_rest, se_rest = _diff(_minus(parent_c, c), _minus(parent_t, t))
                if math.isfinite(d_rest):
                    spread = math.hypot(se, se_rest)
                    z_conc = sign * (d - d_rest) / spread if spread > 0 else 0.0
                else:
                    z_conc = math.inf  # the segment is all of its parent: nothing to compare, nothing against it
                candidates.append((sign * contrib, dim, value, contrib, contrib_se, z, c.n + t.n, d, z_conc))
        if not candidates:
            why = "no segment with data in both arms"
            break
        candidates.sort(key=lambda c: c[0], reverse=True)
        _, dim, value, contrib, contrib_se, z, n, d, z_conc = candidates[0]
        if n < min_support:
            why = f"the next segment ({dim}={value}) has {n:,} units, below the minimum support {min_support:,}"
            break
        if z < z_crit:
            why = f"the next segment's contribution ({dim}={value}) is not significant (z = {z:.2f} < {z_crit:.2f})"
            break
        if z_conc < z_crit:
            why = (
                f"the effect is not concentrated further: {dim}={value} changes like the rest "
                f"(z = {z_conc:.2f} < {z_crit:.2f})"
            )
            break
        lo, hi = (contrib - z_crit * contrib_se) / total, (contrib + z_crit * contrib_se) / total
        alternatives = [{"dimension": a[1], "value": a[2], "share": a[3] / total, "n": a[6]} for a in candidates[1:4]]
        ci = (contrib - z_crit * contrib_se, contrib + z_crit * contrib_se)
        steps.append(
            Step(dim, value, contrib, ci, contrib / total, (min(lo, hi), max(lo, hi)), z, n, d, alternatives)
        )
        current = current.filter(pl.col(dim) == value)
        remaining.remove(dim)
        why = "every dimension used" if not remaining else why
    word = "rise" if total > 0 else "drop"
    if steps:
        last = steps[-1]
        where = " × ".join(f"{s.dimension}={s.value}" for s in steps)
        explanation = (
            f"the {word} in {metric} is concentrated in {where} ({last.share:.0%} of the change, n = {last.n:,}, "
            f"95 % CI of the share {last.share_ci[0]:.0%}–{last.share_ci[1]:.0%})"
        )
    else:
        explanation = f"the {word} in {metric} is not concentrated in any one segment ({why})"
    return DrillDown(metric, total, total_se, tuple(steps), explanation, why)
