"""Analysing an experiment: one aggregation pass to sufficient statistics, then every statistic from those.

``aggregate`` turns rows (any polars frame or lazy Parquet/CSV scan with the spec's columns) into one row per
(variant, dimensions…) holding n, Σy, Σy², Σx, Σx², Σxy per metric — the only pass over the data. ``analyze``
computes from it: arm counts and the SRM check; each metric's difference, lift and interval (Welch, Newcombe or the
delta method; CUPED when the metric names a pre-period covariate); Benjamini–Hochberg across metrics; guardrails
with the sequential test; the root-cause drill-down of each mean/proportion metric. When the SRM check flags the
split or an arm is below ``min_sample``, conclusions are withheld (the numbers are still reported).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl
from scipy import stats as sps

from keel.errors import KeelError
from keel.experiments.drilldown import drilldown
from keel.experiments.spec import ExperimentSpec, Guardrail, Metric
from keel.experiments.stats import (
    Estimate,
    Moments,
    benjamini_hochberg,
    cuped,
    msprt_pvalue,
    proportions,
    ratio,
    srm,
    welch,
)

SUFFIXES = ("n", "sy", "syy", "sx", "sxx", "sxy")


class ExperimentDataError(KeelError):
    """The data given for an experiment lacks what its spec needs (a column, an arm)."""


def _yx(m: Metric) -> tuple[str, str | None]:
    return (m.numerator, m.denominator) if m.kind == "ratio" else (m.column, m.covariate)


def metric_columns(m: Metric) -> list[pl.Expr]:
    """The metric's y (and x) as Float64 columns, null where the row cannot count: y or x missing, NaN or infinite
    (a pair counts only when both parts do). Sums then skip those rows by themselves."""
    y_name, x_name = _yx(m)
    y = pl.col(y_name).cast(pl.Float64)
    y = pl.when(y.is_finite()).then(y)
    if not x_name:
        return [y.alias(f"__{m.name}__y")]
    x = pl.col(x_name).cast(pl.Float64)
    x = pl.when(x.is_finite()).then(x)
    return [
        pl.when(x.is_not_null()).then(y).alias(f"__{m.name}__y"),
        pl.when(y.is_not_null()).then(x).alias(f"__{m.name}__x"),
    ]


def metric_exprs(m: Metric) -> list[pl.Expr]:
    """The sufficient statistics of one metric as aggregation expressions over ``metric_columns``."""
    y = pl.col(f"__{m.name}__y")
    out = [
        y.count().cast(pl.Int64).alias(f"{m.name}__n"),
        y.sum().alias(f"{m.name}__sy"),
        (y * y).sum().alias(f"{m.name}__syy"),
    ]
    if _yx(m)[1]:
        x = pl.col(f"__{m.name}__x")
        out += [
            x.sum().alias(f"{m.name}__sx"),
            (x * x).sum().alias(f"{m.name}__sxx"),
            (x * y).sum().alias(f"{m.name}__sxy"),
        ]
    return out


def scan_data(path) -> pl.LazyFrame:
    """Parquet lazily (only the spec's columns are read), CSV with types inferred from every row."""
    from pathlib import Path

    from keel.contracts.io import read_typed_data_file
    from keel.errors import DataReadError

    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        if not p.is_file():
            raise DataReadError(f"{p}: no such data file")
        try:
            lf = pl.scan_parquet(p)
            lf.collect_schema()
            return lf
        except Exception as exc:  # noqa: BLE001 - arrow/polars errors all mean "cannot read this file"
            raise DataReadError(f"{p}: cannot read as parquet: {str(exc).splitlines()[0]}") from None
    return read_typed_data_file(p).lazy()


def check_columns(spec: ExperimentSpec, columns: list[str], where: str) -> None:
    missing = [c for c in spec.columns if c not in columns]
    if missing:
        raise ExperimentDataError(
            f"{where}: column(s) {', '.join(missing)} needed by the spec ({spec.source}) are missing; "
            f"the data has {', '.join(columns[:20])}{' …' if len(columns) > 20 else ''}"
        )


def aggregate(
    data: pl.DataFrame | pl.LazyFrame, spec: ExperimentSpec, by: tuple[str, ...] | None = None
) -> pl.DataFrame:
    """One row per (variant, *by) with every metric's sufficient statistics (by default by = the spec's dimensions)."""
    by = spec.dimensions if by is None else by
    lf = data.lazy() if isinstance(data, pl.DataFrame) else data
    exprs, cols = [pl.len().alias("units")], []
    for m in spec.metrics:
        cols += metric_columns(m)
        exprs += metric_exprs(m)
    return lf.with_columns(cols).group_by(spec.variant_column, *by).agg(exprs).collect()


def moments(row: dict[str, Any], metric: str) -> Moments:
    return Moments(*[(row.get(f"{metric}__{s}") or 0) for s in SUFFIXES])


def arm_totals(cube: pl.DataFrame, spec: ExperimentSpec) -> dict[str, dict[str, Any]]:
    """Sum a cube over its dimensions: variant label → {units, <metric>__n, …}."""
    sums = cube.group_by(spec.variant_column).agg(pl.exclude(spec.variant_column, *spec.dimensions).sum())
    return {str(r[spec.variant_column]): r for r in sums.to_dicts()}


def estimate(m: Metric, control: Moments, treatment: Moments, alpha: float) -> tuple[Estimate, dict[str, Any]]:
    extra: dict[str, Any] = {}
    if m.kind == "ratio":
        return ratio(control, treatment, alpha), extra
    base = proportions(control, treatment, alpha) if m.kind == "proportion" else welch(control, treatment, alpha)
    if m.covariate:
        adjusted, theta, reduction = cuped(control, treatment, alpha)
        extra = {
            "cuped": adjusted.as_dict() | {"theta": theta, "variance_reduction": reduction},
            "raw": base.as_dict(),
        }
        return adjusted, extra
    return base, extra


@dataclass(frozen=True)
class GuardrailResult:
    metric: str
    threshold: float
    action: str
    breached: bool
    harm: float  # relative change in the harmful direction (positive = worse)
    harm_ci: tuple[float, float]
    msprt_p: float  # always-valid p-value against "harm = threshold"
    fixed_p: float  # one look's one-sided p-value against the same
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def evaluate_guardrail(
    g: Guardrail, m: Metric, est: Estimate, alpha: float, tau_rel: float, previous_p: float = 1.0
) -> GuardrailResult:
    """Breached when the treatment is worse than the control by more than ``threshold`` (relative) with confidence:
    the always-valid mSPRT p-value for H0: diff = −threshold × control (in the harmful direction) falls below α with
    the estimate beyond it — valid however often it is looked at. ``previous_p``: the last look's p (they only go
    down)."""
    sign = 1.0 if m.direction == "increase" else -1.0
    harm = -sign * est.lift
    harm_ci = tuple(sorted((-sign * est.lift_ci[0], -sign * est.lift_ci[1])))
    theta0 = -sign * g.threshold * est.control  # the tolerated difference, treatment − control
    scale = abs(est.control) if est.control else (est.se * math.sqrt(est.n_control) or 1.0)
    p_seq = msprt_pvalue(est.diff, est.se, tau=tau_rel * scale, previous=previous_p, theta0=theta0)
    beyond = (est.diff - theta0) * sign < 0  # on the harmful side of the tolerance
    fixed = float(sps.norm.cdf((est.diff - theta0) * sign / est.se)) if est.se > 0 else (0.0 if beyond else 1.0)
    breached = bool(beyond and p_seq < alpha)
    word = "worse" if harm > 0 else "better"
    reason = (
        f"{m.name}: treatment {abs(harm):.2%} {word} than control (95 % CI of the harm [{harm_ci[0]:.2%}, "
        f"{harm_ci[1]:.2%}]), tolerance {g.threshold:.2%}; always-valid p = {p_seq:.3g}"
    )
    return GuardrailResult(g.metric, g.threshold, g.action, breached, harm, harm_ci, p_seq, fixed, reason)


def analyze(
    data: pl.DataFrame | pl.LazyFrame,
    spec: ExperimentSpec,
    *,
    where: str = "data",
    min_support: int = 200,
    previous_p: dict[str, float] | None = None,
) -> dict[str, Any]:
    lf = data.lazy() if isinstance(data, pl.DataFrame) else data
    schema = lf.collect_schema()
    check_columns(spec, schema.names(), where)
    for m in spec.metrics:
        for col in m.columns:
            if not (schema[col].is_numeric() or schema[col] == pl.Boolean):
                raise ExperimentDataError(
                    f"{where}: column '{col}' of metric '{m.name}' must be numeric, it is {schema[col]}"
                )
    cube = aggregate(lf, spec)
    arms = arm_totals(cube, spec)
    c_label, t_label = spec.control_label, spec.treatment_label
    labels = sorted(arms)
    if c_label not in arms or t_label not in arms:
        raise ExperimentDataError(
            f"{where}: column '{spec.variant_column}' must hold both '{c_label}' and '{t_label}'; found {labels}"
        )
    control, treatment = arms[c_label], arms[t_label]
    n_c, n_t = int(control["units"]), int(treatment["units"])
    check = srm(n_c, n_t, spec.traffic_ratio, spec.srm_threshold)
    withheld: list[str] = []
    if check.flagged:
        withheld.append(
            f"sample-ratio mismatch: {n_t:,} treatment / {n_c:,} control units, treatment share "
            f"{check.observed_treatment_share:.4f} vs planned {spec.traffic_ratio} (p = {check.p_value:.2g})"
        )
    if min(n_c, n_t) < spec.min_sample:
        withheld.append(f"too few units: {min(n_c, n_t):,} in the smaller arm, need {spec.min_sample:,}")

    metrics, ests = [], {}
    for m in spec.metrics:
        mc, mt = moments(control, m.name), moments(treatment, m.name)
        if mc.n < 2 or mt.n < 2 or (m.kind == "ratio" and (mc.sx == 0 or mt.sx == 0)):
            metrics.append({"name": m.name, "kind": m.kind, "direction": m.direction, "error": "not enough data"})
            continue
        est, extra = estimate(m, mc, mt, spec.alpha)
        ests[m.name] = est
        metrics.append({"name": m.name, "kind": m.kind, "direction": m.direction, **est.as_dict(), **extra})
    adjusted = benjamini_hochberg([e["p_value"] for e in metrics if "p_value" in e])
    it = iter(adjusted)
    for e in metrics:
        if "p_value" not in e:
            continue
        e["p_adjusted"] = next(it)
        good = (e["diff"] > 0) == (e["direction"] == "increase")
        if withheld:
            e["verdict"] = "withheld"
        elif e["p_adjusted"] < spec.alpha:
            e["verdict"] = "better" if good else "worse"
        else:
            e["verdict"] = "no detectable change"

    guardrails = []
    for g in spec.guardrails:
        if g.metric not in ests:
            continue
        r = evaluate_guardrail(
            g,
            spec.metric(g.metric),
            ests[g.metric],
            spec.alpha,
            spec.msprt_tau,
            (previous_p or {}).get(g.metric, 1.0),
        )
        guardrails.append(r.as_dict())

    drill = {}
    if spec.dimensions:
        for m in spec.metrics:
            if m.kind == "ratio" or m.name not in ests:
                continue
            d = drilldown(
                cube, spec.variant_column, c_label, t_label, spec.dimensions, m.name,
                min_support=min_support, alpha=spec.alpha,
            )  # fmt: skip
            drill[m.name] = d.as_dict()
    return {
        "experiment": spec.id,
        "arms": {c_label: n_c, t_label: n_t},
        "srm": check.__dict__,
        "conclusions_withheld": bool(withheld),
        "withheld_because": withheld,
        "metrics": metrics,
        "guardrails": guardrails,
        "guardrail_breached": any(g["breached"] for g in guardrails),
        "drilldown": drill,
    }


def decision_p_values(decision: dict[str, Any] | None) -> dict[str, float]:
    """The always-valid p-values a recorded guardrail decision acted on, per metric (the running minimum so far)."""
    if not decision:
        return {}
    return {g["metric"]: float(g["msprt_p"]) for g in decision["evidence"].get("guardrails", []) if "msprt_p" in g}


def with_decision(report: dict[str, Any], decision: dict[str, Any] | None) -> dict[str, Any]:
    """The analysis report joined with the guardrail decision that acted on the experiment (see
    ``keel.experiments.control.guardrail_decision``): a breach that paused or rolled the experiment back stays a
    breach in the analysis, shown with the sequential evidence the decision was taken on, whatever a later look at
    more data says on its own."""
    out = dict(report)
    out["guardrail_decision"] = decision
    if decision:
        out["guardrail_breached"] = True
    return out


def report_markdown(exp_id: str, r: dict) -> str:
    """One experiment's report (``analyze``'s, with its guardrail decision and impact) as markdown for the UI."""
    lines = [f"### {exp_id} ({r['status']}): " + ", ".join(f"{k} {v:,}" for k, v in r["arms"].items())]
    lines += [f"- conclusions withheld: {w}" for w in r["withheld_because"]]
    lines.append(
        "\n| metric | control | treatment | lift | 95 % CI | p (BH) | verdict |\n|---|---:|---:|---:|---|---:|---|"
    )
    for m in r["metrics"]:
        if "error" in m:
            continue
        lines.append(
            f"| {m['name']} | {m['control']:.4g} | {m['treatment']:.4g} | {m['lift']:+.2%} | "
            f"[{m['lift_ci'][0]:+.2%}, {m['lift_ci'][1]:+.2%}] | {m['p_adjusted']:.3g} | {m['verdict']} |"
        )
    decision = r.get("guardrail_decision")
    if decision:
        lines.append(
            f"- **{decision['action']}** by the guardrail sensor at {decision['at']} (policy version "
            f"{decision['version']}), on this evidence:"
        )
        lines += [f"  - BREACHED when it acted: {g['reason']}" for g in decision["evidence"].get("guardrails", [])]
    lines += [f"- guardrail {'BREACHED' if g['breached'] else 'ok'} now: {g['reason']}" for g in r["guardrails"]]
    lines += [f"- drill-down: {d['explanation']}" for d in r["drilldown"].values()]
    impact = r.get("impact")
    if impact:
        lo, hi = impact["interval_80"]
        said = f"- impact: predicted {impact['predicted_lift']:+.1%} (80 % interval {lo:+.1%} … {hi:+.1%})"
        if impact.get("realized_lift") is None:
            lines.append(said + "; not measured yet")
        else:
            inside = "inside" if impact["inside_interval"] else "OUTSIDE"
            lines.append(said + f"; realized {impact['realized_lift']:+.1%} — {inside} the interval")
    return "\n".join(lines)
