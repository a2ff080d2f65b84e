"""Experiment specs (YAML): what is compared, on which units, judged by which metrics, guarded by which limits.

    id: rebooking-offer                # a name: becomes paths (experiments/<id>/…), so ^[a-z0-9][a-z0-9_-]{0,63}$
    model: my-model
    control: {version: 1}              # model versions the gateway routes the arms to
    treatment: {version: 2}
    traffic_ratio: 0.5                 # the treatment's planned share (the SRM check compares against it)
    unit: unit_id                      # the randomization unit's column
    variant_column: variant            # in data given to `keel experiment analyze` (values control/treatment)
    metrics:
      - {name: accepted, kind: proportion, column: offer_accepted, direction: increase, covariate: pre_accepted}
      - {name: revenue_per_offer, kind: ratio, numerator: revenue, denominator: offers, direction: increase}
      - {name: late_logloss, kind: mean, column: log_loss, direction: decrease}
    guardrails:
      - {metric: accepted, threshold: 0.05, action: rollback}   # more than 5 % worse (relative) → act
    min_sample: 1000                   # per arm, before any conclusion
    dimensions: [carrier, origin, hour_band]                   # for the root-cause drill-down
    alpha: 0.05

Errors name the field: ``spec.metrics[1].kind: …``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.errors import KeelError
from keel.names import validate_name
from keel.storage import read_yaml

KINDS = ("mean", "proportion", "ratio")
DIRECTIONS = ("increase", "decrease")
ACTIONS = ("pause", "rollback")


TRAFFIC = ("all", "header")  # ExperimentSpec.traffic


class ExperimentSpecError(KeelError):
    """An experiment spec is malformed; the message names the field."""


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # mean | proportion | ratio
    direction: str  # increase | decrease: which way is good
    column: str | None = None  # mean / proportion
    numerator: str | None = None  # ratio
    denominator: str | None = None
    covariate: str | None = None  # a pre-period column for CUPED (mean / proportion)

    @property
    def columns(self) -> list[str]:
        cols = [self.column] if self.kind != "ratio" else [self.numerator, self.denominator]
        return [c for c in (*cols, self.covariate) if c]


@dataclass(frozen=True)
class Guardrail:
    metric: str
    threshold: float  # the largest tolerated relative change in the harmful direction (0.05 = 5 % worse)
    action: str  # pause | rollback


@dataclass(frozen=True)
class ExperimentSpec:
    id: str
    metrics: tuple[Metric, ...]
    model: str = ""  # the served model; empty: the installed use case's (load_spec fills it in)
    control_version: int | None = None
    treatment_version: int | None = None
    traffic_ratio: float = 0.5
    unit: str = "unit_id"
    variant_column: str = "variant"
    control_label: str = "control"
    treatment_label: str = "treatment"
    guardrails: tuple[Guardrail, ...] = ()
    min_sample: int = 100
    dimensions: tuple[str, ...] = ()
    alpha: float = 0.05
    srm_threshold: float = 0.001
    msprt_tau: float = 0.1  # mixing scale of the sequential test, relative to the metric's control mean
    # Simulated business outcomes for the data lake (keel.experiments.simulator; documented, seeded, known truth):
    # {seed, base_rate, lift, planted: {column: value}, planted_lift}. None: the lake has only real outcomes.
    simulation: dict[str, Any] | None = None
    # What the treatment is, for the impact predictor (keel.experiments.impact): {metric, discount, target_late,
    # base_rate}. None: no lift is predicted for this experiment.
    impact: dict[str, Any] | None = None
    # Which requests it takes: "all" — the model's traffic is split between its arms (one such experiment per model
    # at a time); "header" — only requests that name it (``x-experiment-id: <id>``), so several run on one model.
    traffic: str = "all"
    source: str = field(default="<dict>", compare=False)

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def columns(self) -> list[str]:
        cols = [self.variant_column, *self.dimensions]
        for m in self.metrics:
            cols += m.columns
        return list(dict.fromkeys(cols))


def _err(source: str, where: str, message: str) -> ExperimentSpecError:
    return ExperimentSpecError(f"{source}: spec.{where}: {message}")


def _num(source, where, value, *, lo=None, hi=None, integer=False, lo_open=False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        rng = f" in {'(' if lo_open else '['}{lo}, {hi}]" if lo is not None and hi is not None else ""
        raise _err(source, where, f"must be a{'n integer' if integer else ' number'}{rng}, got {value!r}")
    return int(value) if integer else float(value)


def _str(source, where, value) -> str:
    if not isinstance(value, str) or not value:
        raise _err(source, where, f"must be a non-empty string, got {value!r}")
    return value


def parse_spec(raw: Any, source: str = "<dict>") -> ExperimentSpec:
    if not isinstance(raw, dict):
        raise ExperimentSpecError(f"{source}: an experiment spec is a mapping, got {type(raw).__name__}")
    known = {
        "id", "model", "control", "treatment", "traffic_ratio", "unit", "variant_column", "control_label",
        "treatment_label", "metrics", "guardrails", "min_sample", "dimensions", "alpha", "srm_threshold", "msprt_tau",
        "description", "simulation", "impact", "traffic",
    }  # fmt: skip
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _err(source, unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
    try:
        exp_id = validate_name(_str(source, "id", raw.get("id")), what="experiment id")
    except KeelError as exc:
        raise _err(source, "id", str(exc)) from None
    versions = {}
    for arm in ("control", "treatment"):
        v = raw.get(arm)
        if v is None:
            versions[arm] = None
            continue
        if not isinstance(v, dict) or "version" not in v:
            raise _err(source, arm, "must be a mapping with the model version, e.g. {version: 2}")
        versions[arm] = _num(source, f"{arm}.version", v["version"], lo=1, integer=True)
    metrics_raw = raw.get("metrics")
    if not isinstance(metrics_raw, list) or not metrics_raw:
        raise _err(source, "metrics", "needs at least one metric")
    metrics = []
    for i, m in enumerate(metrics_raw):
        where = f"metrics[{i}]"
        if not isinstance(m, dict):
            raise _err(source, where, "must be a mapping")
        name = _str(source, f"{where}.name", m.get("name"))
        kind = m.get("kind", "mean")
        if kind not in KINDS:
            raise _err(source, f"{where}.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
        direction = m.get("direction")
        if direction not in DIRECTIONS:
            raise _err(source, f"{where}.direction", f"must be increase or decrease, got {direction!r}")
        if kind == "ratio":
            num = _str(source, f"{where}.numerator", m.get("numerator"))
            den = _str(source, f"{where}.denominator", m.get("denominator"))
            if m.get("covariate"):
                raise _err(source, f"{where}.covariate", "CUPED applies to mean and proportion metrics")
            metrics.append(Metric(name, kind, direction, numerator=num, denominator=den))
        else:
            col = _str(source, f"{where}.column", m.get("column"))
            cov = m.get("covariate")
            metrics.append(
                Metric(
                    name,
                    kind,
                    direction,
                    column=col,
                    covariate=_str(source, f"{where}.covariate", cov) if cov else None,
                )
            )
    names = [m.name for m in metrics]
    if len(set(names)) != len(names):
        raise _err(source, "metrics", f"metric names repeat: {names}")
    guardrails = []
    for i, g in enumerate(raw.get("guardrails") or []):
        where = f"guardrails[{i}]"
        if not isinstance(g, dict):
            raise _err(source, where, "must be a mapping {metric, threshold, action}")
        metric = _str(source, f"{where}.metric", g.get("metric"))
        if metric not in names:
            raise _err(source, f"{where}.metric", f"names no metric of this spec ({', '.join(names)})")
        threshold = _num(source, f"{where}.threshold", g.get("threshold"), lo=0, hi=10)
        action = g.get("action")
        if action not in ACTIONS:
            raise _err(source, f"{where}.action", f"must be pause or rollback, got {action!r}")
        guardrails.append(Guardrail(metric, threshold, action))
    dims = raw.get("dimensions") or []
    if not isinstance(dims, list) or not all(isinstance(d, str) and d for d in dims):
        raise _err(source, "dimensions", "must be a list of column names")
    spec = ExperimentSpec(
        id=exp_id,
        metrics=tuple(metrics),
        model=_str(source, "model", raw.get("model") or _default_model(source)),
        control_version=versions["control"],
        treatment_version=versions["treatment"],
        traffic_ratio=_num(source, "traffic_ratio", raw.get("traffic_ratio", 0.5), lo=0, hi=1, lo_open=True),
        unit=_str(source, "unit", raw.get("unit", "unit_id")),
        variant_column=_str(source, "variant_column", raw.get("variant_column", "variant")),
        control_label=_str(source, "control_label", raw.get("control_label", "control")),
        treatment_label=_str(source, "treatment_label", raw.get("treatment_label", "treatment")),
        guardrails=tuple(guardrails),
        min_sample=_num(source, "min_sample", raw.get("min_sample", 100), lo=2, integer=True),
        dimensions=tuple(dims),
        alpha=_num(source, "alpha", raw.get("alpha", 0.05), lo=0, hi=0.5, lo_open=True),
        srm_threshold=_num(source, "srm_threshold", raw.get("srm_threshold", 0.001), lo=0, hi=0.5, lo_open=True),
        msprt_tau=_num(source, "msprt_tau", raw.get("msprt_tau", 0.1), lo=0, hi=10, lo_open=True),
        simulation=_simulation(source, raw.get("simulation")),
        impact=_impact(source, raw.get("impact"), metrics, raw.get("simulation")),
        traffic=raw.get("traffic", "all"),
        source=source,
    )
    if spec.traffic not in TRAFFIC:
        raise _err(source, "traffic", f"must be one of {', '.join(TRAFFIC)}, got {spec.traffic!r}")
    if spec.traffic_ratio >= 1:
        raise _err(source, "traffic_ratio", "the treatment's share must leave the control some traffic (< 1)")
    if spec.control_version is not None and spec.control_version == spec.treatment_version:
        raise _err(source, "treatment.version", "treatment and control are the same model version")
    return spec


def _impact(source: str, raw: Any, metrics: Any, simulation: Any) -> dict[str, Any] | None:
    """``impact: {metric, discount, target_late, base_rate}``: the configuration the impact predictor reads."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _err(source, "impact", "must be a mapping {metric, discount, target_late, base_rate}")
    unknown = sorted(set(raw) - {"metric", "discount", "target_late", "base_rate"})
    if unknown:
        raise _err(source, f"impact.{unknown[0]}", "unknown field")
    names = {m.name: m for m in metrics}
    metric = raw.get("metric")
    if metric not in names or names[metric].kind != "proportion":
        raise _err(source, "impact.metric", f"must name a proportion metric of this spec, got {metric!r}")
    default_base = simulation.get("base_rate", 0.12) if isinstance(simulation, dict) else 0.12
    target_late = raw.get("target_late", False)
    if not isinstance(target_late, bool):
        raise _err(source, "impact.target_late", f"must be true or false, got {target_late!r}")
    return {
        "metric": metric,
        "discount": _num(source, "impact.discount", raw.get("discount"), lo=0, hi=0.3),
        "target_late": int(target_late),
        "base_rate": _num(source, "impact.base_rate", raw.get("base_rate", default_base), lo=0, hi=1, lo_open=True),
    }


def _simulation(source: str, raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _err(source, "simulation", "must be a mapping {seed, base_rate, lift, planted, planted_lift}")
    unknown = sorted(set(raw) - {"seed", "base_rate", "lift", "planted", "planted_lift"})
    if unknown:
        raise _err(source, f"simulation.{unknown[0]}", "unknown field")
    out = {
        "seed": int(_num(source, "simulation.seed", raw.get("seed", 0), lo=0, integer=True)),
        "base_rate": _num(source, "simulation.base_rate", raw.get("base_rate", 0.12), lo=0, hi=1),
        "lift": _num(source, "simulation.lift", raw.get("lift", 0.0), lo=-1, hi=10),
        "planted_lift": _num(source, "simulation.planted_lift", raw.get("planted_lift", 0.0), lo=-1, hi=10),
        "planted": raw.get("planted") or {},
    }
    if not isinstance(out["planted"], dict):
        raise _err(source, "simulation.planted", "must map columns to values")
    return out


def _default_model(source: str) -> str:
    """The model of the one installed use case; with several, the spec must name it."""
    from keel.usecase import installed

    served = sorted(uc.model.name for uc in installed().values())
    if len(served) != 1:
        raise ExperimentSpecError(
            f"{source}: model: required — the installed models are {', '.join(served) or 'none'}"
        )
    return served[0]


def load_spec(path: str | Path) -> ExperimentSpec:
    return parse_spec(read_yaml(path, ExperimentSpecError, "experiment spec"), source=str(path))
