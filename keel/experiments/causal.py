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
and gives each its interval — the analytic OLS (t) interval of the treatment coefficient for linear regression;
a percentile bootstrap with ``ci_simulations`` ≥ 200 resamples for propensity-score weighting (the propensity
model is refitted on every resample, so the interval covers its uncertainty too) — runs each refuter with its
bounded ``num_simulations``, and reports the estimate, the intervals, the refutation results (each with a
pass/fail by a stated rule) and the assumptions the estimate rests on. The intervals are keel's, computed on the
same design matrix DoWhy estimates on (categorical common causes one-hot, first level dropped), and the point
estimates are checked to agree with DoWhy's.

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
MAX_SIMULATIONS = 200  # refuter rounds
MIN_BOOTSTRAP, MAX_BOOTSTRAP = 200, 5000  # bootstrap resamples for the propensity-weighting interval
PS_CLIP = (0.05, 0.95)  # DoWhy's default propensity clipping, mirrored by keel's bootstrap


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
    ci_simulations: int = MIN_BOOTSTRAP  # bootstrap resamples for intervals that need them
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
        raise _err(source, "graph", "must list the edges, e.g. [[month, outcome], [treatment, outcome]]")
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
    ci_sims = raw.get("ci_simulations", MIN_BOOTSTRAP)
    if not isinstance(ci_sims, int) or isinstance(ci_sims, bool) or not MIN_BOOTSTRAP <= ci_sims <= MAX_BOOTSTRAP:
        raise _err(
            source,
            "ci_simulations",
            f"must be an integer in [{MIN_BOOTSTRAP}, {MAX_BOOTSTRAP}] (bootstrap resamples)",
        )
    level = raw.get("confidence_level", 0.95)
    if not isinstance(level, float) or not 0.5 < level < 1:
        raise _err(source, "confidence_level", "must be in (0.5, 1)")
    return CausalSpec(cid, names["treatment"], names["outcome"], tuple(edges), estimators, tuple(refuters), sample,
                      int(raw.get("seed", 0)), ci_sims, level, source)  # fmt: skip


def load_causal_spec(path: str | Path) -> CausalSpec:
    return parse_causal_spec(read_yaml(path, CausalSpecError, "causal analysis spec"), source=str(path))


def design_matrix(df, columns: list[str]):
    """The common causes as DoWhy's estimators encode them: numeric columns as they are, the others one-hot with
    the first level dropped (float64)."""
    import numpy as np
    import pandas as pd

    if not columns:
        return np.zeros((len(df), 0))
    return pd.get_dummies(df[columns], drop_first=True, dtype=float).to_numpy(dtype=np.float64)


def ols_effect_interval(x, t, y, level: float, modifiers=None) -> tuple[float, float, float]:
    """Linear regression y ~ 1 + t + X (+ t·(M − M̄) for effect modifiers M): the treatment coefficient and its
    analytic (t-distribution) interval. With modifiers centred on their sample means, the coefficient of t is the
    effect averaged over this sample's modifiers — the average of t·(β + γ·M) that DoWhy's linear estimator reports,
    whose design is y ~ 1 + t + X + t·M (the same column space) — so the interval belongs to that estimate."""
    import numpy as np
    import statsmodels.api as sm

    columns = [t, x]
    if modifiers is not None and modifiers.shape[1]:
        columns.append(t[:, None] * (modifiers - modifiers.mean(axis=0)))
    design = sm.add_constant(np.column_stack(columns), has_constant="add")
    fit = sm.OLS(y, design).fit()
    lo, hi = fit.conf_int(alpha=1 - level)[1]
    return float(fit.params[1]), float(lo), float(hi)


def ipw_effect(x, t, y) -> float:
    """Propensity-score weighting (ATE, the Hájek form DoWhy's "ips_weight" computes): a logistic propensity on X,
    clipped to PS_CLIP, weights 1/p for the treated and 1/(1−p) for the others, difference of weighted means."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    if x.shape[1]:
        p = LogisticRegression().fit(x, t).predict_proba(x)[:, 1]
    else:
        p = np.full(len(t), t.mean())
    p = np.clip(p, *PS_CLIP)
    wt, wc = t / p, (1 - t) / (1 - p)
    return float((wt * y).sum() / wt.sum() - (wc * y).sum() / wc.sum())


def bootstrap_interval(estimator, x, t, y, resamples: int, level: float, seed: int) -> tuple[float, float]:
    """Percentile bootstrap: ``estimator`` refitted on ``resamples`` row resamples (each with both arms)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n, values = len(t), []
    while len(values) < resamples:
        idx = rng.integers(0, n, n)
        if 0 < t[idx].sum() < n:
            values.append(estimator(x[idx], t[idx], y[idx]))
    tail = (1 - level) / 2
    lo, hi = np.quantile(values, [tail, 1 - tail])
    return float(lo), float(hi)


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
        # Outcome causes that are not the treatment's (DoWhy's effect modifiers): its linear estimator fits their
        # interaction with the treatment, so keel's interval is computed on the same design.
        modifiers = sorted(set(model.get_effect_modifiers()) - set(backdoor) - {spec.treatment, spec.outcome})
        x = design_matrix(df, backdoor)
        m = design_matrix(df, modifiers)
        tv = df[spec.treatment].to_numpy(dtype=np.float64)
        yv = df[spec.outcome].to_numpy(dtype=np.float64)
        estimates, first = [], None
        for method in spec.estimators:
            kwargs = {"target_units": "ate"} if "propensity" in method else {}
            est = model.estimate_effect(
                identified, method_name=method, confidence_intervals=False, effect_modifiers=modifiers, **kwargs
            )
            adjusted = f"ATE of {spec.treatment} on {spec.outcome}, adjusting for {{{', '.join(backdoor)}}}"
            if method == "backdoor.linear_regression":
                value, lo, hi = ols_effect_interval(x, tv, yv, spec.confidence_level, m)
                ci_method = f"analytic OLS t interval ({spec.confidence_level:.0%})"
                estimand = adjusted + (
                    f"; effect modifiers {{{', '.join(modifiers)}}} as {spec.treatment} × modifier terms, the effect "
                    "averaged over this sample's modifiers"
                    if modifiers
                    else "; a constant effect (no modifiers)"
                )
            else:
                value = ipw_effect(x, tv, yv)
                lo, hi = bootstrap_interval(
                    ipw_effect, x, tv, yv, spec.ci_simulations, spec.confidence_level, spec.seed
                )
                ci_method = f"percentile bootstrap, {spec.ci_simulations} resamples, propensity refitted"
                estimand = adjusted + " by inverse propensity weights (effect modifiers do not enter)"
            if not math.isclose(value, float(est.value), rel_tol=1e-4, abs_tol=1e-6 * (1 + abs(value))):
                raise CausalSpecError(
                    f"{where}: {method}: keel's estimate {value:.6g} disagrees with DoWhy's {float(est.value):.6g} "
                    "on the same design — adjustment set and effect modifiers alike (the interval would not belong to the "
                    "estimate)"
                )
            estimates.append({"method": method, "value": float(est.value), "ci": [lo, hi], "ci_method": ci_method,
                              "estimand": estimand})  # fmt: skip
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
        "effect_modifiers": modifiers,
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
