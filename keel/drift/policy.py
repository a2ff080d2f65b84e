"""What drift does: a pure decision (freeze, unfreeze, retrain) computed from a drift report summary and a policy.

The drift sensor turns a decision into actions (online-store freezes, run requests); the decision itself is a
value, so it is tested without Dagster and printed in the sensor's log before anything happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITY_RANK = {"none": 0, "warn": 1, "error": 2}


@dataclass(frozen=True)
class DriftPolicy:
    freeze_at: str = "error"  # freeze a feature whose drift severity reaches this (none = never)
    retrain_at: str = "warn"  # ask for retraining when any feature's severity reaches this
    unfreeze_when_clear: bool = True  # a frozen feature that no longer drifts is unfrozen


@dataclass(frozen=True)
class FeatureFreeze:
    feature: str
    value: float | None  # served while frozen: the reference default
    reason: str


@dataclass(frozen=True)
class DriftDecision:
    window: str
    freeze: tuple[FeatureFreeze, ...] = ()
    unfreeze: tuple[str, ...] = ()
    retrain: bool = False
    retrain_reason: str = ""
    drifted: tuple[str, ...] = field(default_factory=tuple)
    not_frozen: tuple[str, ...] = ()  # drifted past the freeze level but not a served feature (the label, a category)

    @property
    def is_noop(self) -> bool:
        return not (self.freeze or self.unfreeze or self.retrain)


def decide(
    window: str,
    features: dict[str, dict],
    policy: DriftPolicy,
    already_frozen: set[str],
    freezable: set[str] | None = None,
) -> DriftDecision:
    """``features``: per feature ``{"drifted": bool|None, "severity": str, "value": float|None, "threshold": float,
    "metric": str, "reference_mean": float|None}`` as the drift report's metadata carries them. ``freezable``: the
    features the online store serves (None: all) — a drifted label or categorical column cannot be frozen, its drift
    asks for retraining only and is listed in ``not_frozen``."""
    freeze, unfreeze, retrain_causes, not_frozen = [], [], [], []
    drifted = sorted(f for f, s in features.items() if s.get("drifted"))
    for name in sorted(features):
        s = features[name]
        rank = SEVERITY_RANK.get(s.get("severity", "none"), 0)
        if (
            s.get("drifted")
            and policy.freeze_at != "none"
            and rank >= SEVERITY_RANK[policy.freeze_at]
            and name not in already_frozen
        ):
            if freezable is not None and name not in freezable:
                not_frozen.append(name)
            else:
                reason = f"drift in {window}: {s.get('metric')} {_num(s.get('value'))} > {_num(s.get('threshold'))} ({s.get('severity')})"
                freeze.append(FeatureFreeze(name, s.get("reference_mean"), reason))
        if s.get("drifted") is False and name in already_frozen and policy.unfreeze_when_clear:
            unfreeze.append(name)
        if s.get("drifted") and policy.retrain_at != "none" and rank >= SEVERITY_RANK[policy.retrain_at]:
            retrain_causes.append(name)
    return DriftDecision(
        window=window,
        freeze=tuple(freeze),
        unfreeze=tuple(unfreeze),
        retrain=bool(retrain_causes),
        retrain_reason=f"drift in {window} on {', '.join(retrain_causes)}" if retrain_causes else "",
        drifted=tuple(drifted),
        not_frozen=tuple(not_frozen),
    )


def _num(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, int | float) else str(v)
