"""A canary rollout's plan, its state and what a decision returns (keel/canary.py decides): the records the policy
store keeps for a rollout (keel/canary_control.py) and the exposure reader fills (keel/exposures.py ``ArmStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keel.loop.shadow import ShadowPolicy

RUNNING, PROMOTED, ROLLED_BACK, PAUSED = "running", "promoted", "rolled_back", "paused"
FINISHED = (PROMOTED, ROLLED_BACK)


@dataclass(frozen=True)
class CanaryPlan:
    steps: tuple[float, ...] = (1, 10, 30, 50, 100)
    interval_s: float = 60.0
    min_samples: int = 200
    error_ratio: float = 1.2
    alpha: float = 0.05
    max_log_loss_increase: float = 0.02
    latency_ratio: float = 1.2  # the challenger's p99 must also exceed this × the champion's to breach
    min_labelled: int = 200
    progress_deadline_s: float = 3600.0
    on_breach: str = "rollback"  # or "pause"
    p99_target_ms: float | None = None  # the model's SLA tier; None: no latency check
    loss: str = (
        "log-loss"  # the per-request loss the quality check compares (its task's: squared-error for regression)
    )
    # A first step at 0 % with a shadow policy is the **shadow** step: the challenger scores every request beside
    # the champion, unserved, and advances only when it is surely better on the same requests' realized labels
    # (keel/loop/shadow.py); surely worse, or not better within ``shadow_max_s``, rolls it back.
    shadow: ShadowPolicy | None = None
    shadow_max_s: float = 21 * 86400.0
    # Paired quality: the challenger scores the champion's requests in shadow during every step, and the quality
    # guard compares their losses on the same requests (clustered by hour) instead of the arms' disjoint samples.
    paired: bool = False
    # Quality before the labels (keel/loop/estimate.py): {"metric", "margin", "alpha", "trust"} — a step (the shadow
    # step too) whose challenger's estimate is surely worse than the champion's by more than ``margin`` is rolled
    # back at once, before any label. None: the estimate is only recorded in the evidence.
    estimate: dict[str, Any] | None = None
    # The loop's gate judged the challenger's quality on realized labels before the canary (the newest labelled
    # month's held-out days): the last step does not wait for labels of the steps' own requests — a use case whose
    # labels take weeks (keel.usecase.Loop.shadow False). The paired guard still rolls back on labels that land.
    gate_judged: bool = False

    @classmethod
    def from_policy(cls, body: dict[str, Any], p99_target_ms: float | None = None) -> CanaryPlan:
        keys = {f for f in cls.__dataclass_fields__} - {"p99_target_ms", "steps", "shadow"}
        kwargs = {k: body[k] for k in keys if k in body}
        steps = tuple(float(s) for s in body.get("steps", cls.steps))
        shadow = ShadowPolicy(**body["shadow"]) if body.get("shadow") is not None else None
        return cls(steps=steps, p99_target_ms=p99_target_ms, shadow=shadow, **kwargs)

    def in_shadow(self, state: CanaryState) -> bool:
        return self.shadow is not None and state.status == RUNNING and self.steps[state.step] == 0


@dataclass(frozen=True)
class CanaryState:
    status: str = RUNNING
    step: int = 0  # index into plan.steps
    started_at: float = 0.0  # epoch seconds
    step_started_at: float = 0.0
    quality_judged: bool = False  # some step's quality verdict (≥ min_labelled labels per arm) found no breach
    # When the challenger first answered (served, or scored in shadow) in this rollout: its clocks — the shadow's
    # limit, the progress deadline — run from here, not from the commit (a busy machine may deploy it days later).
    armed_at: float | None = None

    def percent(self, plan: CanaryPlan) -> float:
        if self.status == PROMOTED:
            return 100.0
        if self.status in (ROLLED_BACK,):
            return 0.0
        return plan.steps[self.step]


@dataclass(frozen=True)
class ArmStats:
    """One arm's exposures in the current step's window."""

    requests: int
    errors: int
    p99_ms: float | None = None
    labelled: int = 0
    # Realized quality: the mean per-request loss of the model's task on the labelled requests (keel/metrics.py:
    # log-loss for a binary label — hence the name — squared error for a regression), and its sample variance.
    log_loss: float | None = None
    log_loss_var: float | None = None
    # Answered requests, and how many of them were slower than the SLA tier's p99 target (None: not counted).
    answered: int = 0
    slow: int | None = None


@dataclass(frozen=True)
class Decision:
    action: str  # advance | hold | promote | rollback | pause | none
    state: CanaryState  # the state after the action
    percent: float  # the challenger's traffic share after the action
    reasons: tuple[str, ...]
    evidence: dict[str, Any] = field(default_factory=dict)
