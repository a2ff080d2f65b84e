"""Causal analysis with DoWhy: a declared graph, backdoor identification, two estimators, refuters, a report.

A causal analysis is YAML:

    id: low-visibility-departure-delay
    treatment: low_visibility            # binary (0/1 or bool)
    outcome: dep_delay
    graph:                               # every edge of the causal graph, cause → effect
      - [month, low_visibility]
      - [month, dep_delay]
      - [hour, low_visibility]
      - [hour, dep_delay]
      - [origin, low_visibility]
      - [origin, dep_delay]
      - [carrier, dep_delay]
      - [low_visibility, dep_delay]
    estimators: [backdoor.linear_regression, backdoor.propensity_score_weighting]
    refuters:
      - {method: placebo_treatment_refuter, num_simulations: 20}
      - {method: random_common_cause, num_simulations: 20}
      - {method: data_subset_refuter, num_simulations: 10, subset_fraction: 0.8}
    sample: 50000                        # rows drawn (seeded) before the analysis; omit for all
    seed: 0

``run_causal`` identifies the effect by the backdoor criterion on the graph, estimates it with each estimator
(with a confidence interval: analytic for linear regression, a bounded bootstrap for the propensity-score
method), runs each refuter with its bounded ``num_simulations``, and reports the estimate, the intervals, the
refutation results (each with a pass/fail by a stated rule) and the assumptions the estimate rests on.

Node names are identifiers (they go into a DOT graph; nothing else is interpreted). Refuter pass rules:
a placebo treatment must give an effect within the estimate's own noise of zero (|placebo| ≤ the CI half-width);
a random common cause or a data subset must leave the estimate inside its interval.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from keel.errors import KeelError
from keel.names import validate_name
from keel.storage import read_yaml

ESTIMATORS = ("backdoor.linear_regression", "backdoor.propensity_score_weighting")
REFUTERS = ("placebo_treatment_refuter", "random_common_cause", "data_subset_refuter")
NODE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_SIMULATIONS = 200


class CausalSpecError(KeelError):
    """A causal analysis spec is malformed; the message names the field."""


@dataclass(frozen=True)
class CausalSpec:
    id: str
    treatment: str
    outcome: str
    edges: tuple[tuple[str, str], ...]
    estimators: tuple[str, ...] = ESTIMATORS
    refuters: tuple[dict[str, Any], ...] = (
        {"method": "placebo_treatment_refuter", "num_simulations": 20},
        {"method": "random_common_cause", "num_simulations": 20},
    )
    sample: int | None = None
    seed: int = 0
    ci_simulations: int = 50  # bootstrap rounds for intervals that need them
    confidence_level: float = 0.95
    source: str = "<dict>"

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(n for e in self.edges for n in e))

    @property
    def common_causes(self) -> list[str]:
        """Direct causes of both treatment and outcome (what the backdoor set adjusts for in this graph)."""
        into_t = {a for a, b in self.edges if b == self.treatment}
        into_y = {a for a, b in self.edges if b == self.outcome}
        return sorted((into_t & into_y) - {self.treatment})

    def dot(self) -> str:
        return "digraph { " + " ".join(f"{a} -> {b};" for a, b in self.edges) + " }"


def _err(source: str, where: str, msg: str) -> CausalSpecError:
    return CausalSpecError(f"{source}: causal.{where}: {msg}")


def parse_causal_spec(raw: Any, source: str = "<dict>") -> CausalSpec:
    if not isinstance(raw, dict):
        raise CausalSpecError(f"{source}: a causal analysis spec is a mapping")
    known = {"id", "treatment", "outcome", "graph", "estimators", "refuters", "sample", "seed", "ci_simulations",
             "confidence_level", "description"}  # fmt: skip
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _err(source, unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
    try:
        cid = validate_name(str(raw.get("id")), what="analysis id")
    except KeelError as exc:
        raise _err(source, "id", str(exc)) from None
    names = {}
    for key in ("treatment", "outcome"):
        v = raw.get(key)
        if not isinstance(v, str) or not NODE.match(v):
            raise _err(source, key, f"must be a column name (letters, digits, _), got {v!r}")
        names[key] = v
    graph = raw.get("graph")
    if not isinstance(graph, list) or not graph:
        raise _err(source, "graph", "must list the edges, e.g. [[month, dep_delay], [low_visibility, dep_delay]]")
    edges = []
    for i, e in enumerate(graph):
        if not (isinstance(e, list | tuple) and len(e) == 2 and all(isinstance(n, str) and NODE.match(n) for n in e)):
            raise _err(source, f"graph[{i}]", f"an edge is [cause, effect] of column names, got {e!r}")
        edges.append((e[0], e[1]))
    if (names["treatment"], names["outcome"]) not in edges:
        raise _err(source, "graph", f"has no edge {names['treatment']} → {names['outcome']}: nothing to estimate")
    estimators = tuple(raw.get("estimators") or ESTIMATORS)
    for i, m in enumerate(estimators):
        if m not in ESTIMATORS:
            raise _err(source, f"estimators[{i}]", f"must be one of {', '.join(ESTIMATORS)}, got {m!r}")
    refuters = []
    for i, r in enumerate(raw.get("refuters") or CausalSpec.refuters):
        if not isinstance(r, dict) or r.get("method") not in REFUTERS:
            raise _err(source, f"refuters[{i}].method", f"must be one of {', '.join(REFUTERS)}")
        sims = r.get("num_simulations", 20)
        if not isinstance(sims, int) or isinstance(sims, bool) or not 1 <= sims <= MAX_SIMULATIONS:
            raise _err(source, f"refuters[{i}].num_simulations", f"must be an integer in [1, {MAX_SIMULATIONS}]")
        frac = r.get("subset_fraction", 0.8)
        if not isinstance(frac, int | float) or not 0 < frac < 1:
            raise _err(source, f"refuters[{i}].subset_fraction", "must be in (0, 1)")
        refuters.append({"method": r["method"], "num_simulations": sims, "subset_fraction": float(frac)})
    if len(refuters) < 2:
        raise _err(source, "refuters", "needs at least two refuters")
    sample = raw.get("sample")
    if sample is not None and (not isinstance(sample, int) or isinstance(sample, bool) or sample < 100):
        raise _err(source, "sample", f"must be an integer ≥ 100, got {sample!r}")
    ci_sims = raw.get("ci_simulations", 50)
    if not isinstance(ci_sims, int) or not 10 <= ci_sims <= MAX_SIMULATIONS:
        raise _err(source, "ci_simulations", f"must be an integer in [10, {MAX_SIMULATIONS}]")
    level = raw.get("confidence_level", 0.95)
    if not isinstance(level, float) or not 0.5 < level < 1:
        raise _err(source, "confidence_level", "must be in (0.5, 1)")
    return CausalSpec(cid, names["treatment"], names["outcome"], tuple(edges), estimators, tuple(refuters), sample,
                      int(raw.get("seed", 0)), ci_sims, level, source)  # fmt: skip


def load_causal_spec(path: str | Path) -> CausalSpec:
    return parse_causal_spec(read_yaml(path, CausalSpecError, "causal analysis spec"), source=str(path))


def _interval(estimate) -> tuple[float, float]:
    ci = estimate.get_confidence_intervals()
    flat = [float(x) for x in (ci.ravel() if hasattr(ci, "ravel") else ci)]
    return (min(flat), max(flat))


def run_causal(spec: CausalSpec, data: pl.DataFrame, *, where: str = "data") -> dict[str, Any]:
    """Identify, estimate and refute; the report as a JSON-ready dict."""
    missing = [n for n in spec.nodes if n not in data.columns]
    if missing:
        raise CausalSpecError(f"{where}: column(s) {', '.join(missing)} of the graph ({spec.source}) are missing")
    frame = data.select(spec.nodes).drop_nulls()
    dropped = data.height - frame.height
    if spec.sample and frame.height > spec.sample:
        frame = frame.sample(spec.sample, seed=spec.seed)
    t = frame[spec.treatment]
    if t.dtype != pl.Boolean:
        values = set(t.unique().to_list())
        if not values <= {0, 1}:
            raise CausalSpecError(
                f"{where}: treatment '{spec.treatment}' must be binary (0/1), found {sorted(values)[:5]}"
            )
        frame = frame.with_columns(pl.col(spec.treatment).cast(pl.Boolean))
    if frame[spec.treatment].n_unique() < 2:
        raise CausalSpecError(f"{where}: treatment '{spec.treatment}' takes one value only: nothing to compare")

    import numpy as np
    from dowhy import CausalModel

    np.random.seed(spec.seed)  # DoWhy's refuters and bootstraps draw from numpy's global generator
    df = frame.to_pandas()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = CausalModel(data=df, treatment=spec.treatment, outcome=spec.outcome, graph=spec.dot())
        identified = model.identify_effect(proceed_when_unidentifiable=False)
        backdoor = sorted(identified.get_backdoor_variables())
        estimates, first = [], None
        for method in spec.estimators:
            params = {
                "init_params": {"num_simulations": spec.ci_simulations, "confidence_level": spec.confidence_level}
            }
            kwargs = {"target_units": "ate"} if "propensity" in method else {}
            est = model.estimate_effect(
                identified, method_name=method, confidence_intervals=True, method_params=params, **kwargs
            )
            lo, hi = _interval(est)
            estimates.append({"method": method, "value": float(est.value), "ci": [lo, hi]})
            first = first or (est, lo, hi)
        est, lo, hi = first
        half = (hi - lo) / 2
        refutations = []
        for r in spec.refuters:
            kwargs = {"num_simulations": r["num_simulations"], "random_seed": spec.seed}
            if r["method"] == "placebo_treatment_refuter":
                kwargs["placebo_type"] = "permute"
            if r["method"] == "data_subset_refuter":
                kwargs["subset_fraction"] = r["subset_fraction"]
            ref = model.refute_estimate(identified, est, method_name=r["method"], **kwargs)
            new = float(ref.new_effect if not hasattr(ref.new_effect, "__len__") else np.mean(ref.new_effect))
            if r["method"] == "placebo_treatment_refuter":
                passed, rule = abs(new) <= half, f"|placebo effect| {abs(new):.4g} ≤ CI half-width {half:.4g}"
            else:
                passed, rule = lo <= new <= hi, f"new estimate {new:.4g} inside the CI [{lo:.4g}, {hi:.4g}]"
            result = ref.refutation_result or {}
            refutations.append({
                "method": r["method"], "num_simulations": r["num_simulations"], "new_effect": new,
                "p_value": float(result.get("p_value", math.nan)) if result else None,
                "passed": bool(passed), "rule": rule,
            })  # fmt: skip
    assumptions = [
        f"unconfoundedness: given {{{', '.join(backdoor)}}}, nothing else affects both {spec.treatment} and "
        f"{spec.outcome} (the declared graph is complete)",
        f"positivity: every stratum of {{{', '.join(backdoor)}}} has units with and without {spec.treatment}",
        "no interference: one unit's treatment does not change another's outcome (SUTVA)",
        "backdoor.linear_regression: the outcome is linear in the treatment and the adjustment set",
        "backdoor.propensity_score_weighting: the propensity model (logistic) is well specified; weights clipped to "
        "propensities in [0.05, 0.95]",
    ]
    return {
        "analysis": spec.id,
        "treatment": spec.treatment,
        "outcome": spec.outcome,
        "graph": [list(e) for e in spec.edges],
        "backdoor_set": backdoor,
        "rows": frame.height,
        "rows_dropped_for_nulls": dropped,
        "treated_share": float(frame[spec.treatment].mean()),
        "estimate": estimates[0]["value"],
        "ci": estimates[0]["ci"],
        "estimates": estimates,
        "refutations": refutations,
        "refutations_passed": all(r["passed"] for r in refutations),
        "assumptions": assumptions,
        "estimand": str(identified),
    }


def low_visibility_frame(flights: pl.DataFrame, weather: pl.DataFrame, miles: float = 3.0) -> pl.DataFrame:
    """The shipped observational example on real data: each departed flight with the visibility at its origin in
    its scheduled hour; treatment low_visibility = visib < ``miles``; outcome dep_delay (minutes)."""
    w = weather.select("origin", "time_hour", "visib").unique(["origin", "time_hour"], keep="first")
    return (
        flights.filter(pl.col("dep_delay").is_not_null())
        .join(w, on=["origin", "time_hour"], how="inner")
        .filter(pl.col("visib").is_not_null())
        .select(
            (pl.col("visib") < miles).cast(pl.Int8).alias("low_visibility"),
            pl.col("dep_delay").cast(pl.Float64),
            pl.col("month").cast(pl.String),  # categorical: adjusted for as strata, not as a line
            pl.col("hour").cast(pl.String),
            "carrier",
            "origin",
        )
    )
