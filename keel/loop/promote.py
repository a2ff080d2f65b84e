"""A challenger that passed its gate → a canary, started through the policy store (keel/canary.py does the rest).

``start_canary`` is the decision: given the newest gate result and what the policy store and registry say now,
either the canary policy to commit (its name, body and the commit's reason) or why not. The canary carries its
``origin`` — the drift report, the training run, the gate's numbers — so every promotion or rollback it leads to
can be traced back (``keel ledger why``).

The loop's canary runs on the shared clock: its intervals are simulated seconds. It begins in **shadow** (0 %: the
challenger scores every request beside the champion, unserved) and goes on only when the paired verdict on the same
requests' realized labels (keel/loop/shadow.py) says it is surely better — the quality question, answered on
thousands of paired rows instead of a few hundred disjoint ones. Then two steps sized in requests, 25 % → 100 %,
each held until the challenger has answered ``min_samples`` requests with no breach of errors or latency (and no
sure loss of quality): on the replay's 175 requests a day the rollout after the shadow takes two to three days.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOOP_AUTHOR = "loop"
LOOP_CANARY: dict[str, Any] = {
    "steps": [0, 25, 100],  # 0: the shadow step
    "shadow": {"margin": 0.0, "alpha": 0.05, "min_labelled": 200, "min_clusters": 5},
    "shadow_max_s": 21 * 86400.0,  # simulated: not surely better in three weeks of shadow → rolled back
    "paired": True,  # the steps' quality guard too: on the champion's answers the challenger scores in shadow
    "interval_s": 3600.0,  # simulated: the steps are sized in requests (min_samples), not in time
    "min_samples": 30,  # challenger requests per step (25 % of the replay's 175 a day: 44)
    "min_labelled": 200,
    "max_log_loss_increase": 0.02,
    "progress_deadline_s": 45 * 86400.0,  # simulated: a step not passed in 45 days is rolled back
}


@dataclass(frozen=True)
class GateResult:
    """What challenger_evaluation recorded (its materialization's metadata)."""

    passed: bool
    challenger_version: int
    champion_version: int
    gate_month: str
    reason: str
    drift_window: str | None = None
    drift_event: int | None = None
    challenger_run: str | None = None
    evaluation_event: int | None = None


@dataclass(frozen=True)
class StartCanary:
    name: str
    body: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class NoCanary:
    reason: str


def canary_name(model: str, challenger_version: int) -> str:
    return f"{model}.loop-v{challenger_version}"


def start_canary(
    gate: GateResult | None,
    model: str,
    champion_version: int | None,
    canaries: dict[str, dict[str, Any]],
    label_delay_s: float = 0.0,
    loss: str = "log-loss",
    estimate: dict[str, Any] | None = None,
    shadow: bool = True,
) -> StartCanary | NoCanary:
    """``canaries``: the canary policies in the store (name → body). A canary starts only for a passed gate whose
    champion is still the champion, when no canary of the model is unfinished and none was ever made for this
    challenger (a duplicate tick, a restarted daemon, a rolled-back challenger: never twice). ``label_delay_s``: how
    long the model's labels take to come in (its use case's ``Monitoring.label_delay``), added to the progress
    deadline — quality is judged on realized labels, and a canary must not run out of time waiting for them.
    ``estimate``: the canary's setting for acting on estimated quality (``keel.loop.estimate.canary_estimate``; None
    while the use case's estimates have not earned it). ``shadow``: whether the canary begins in shadow (its use
    case's ``Loop.shadow``); False — labels too slow to judge a shadow in days — starts at the first served step,
    its quality the gate's realized labels and, through the steps, the paired guard's as labels land."""
    if gate is None:
        return NoCanary("no challenger has been judged")
    if not gate.passed:
        return NoCanary(f"challenger v{gate.challenger_version} did not pass its gate: {gate.reason}")
    for name, body in canaries.items():
        if body.get("model") == model and int(body.get("challenger_version", -1)) == gate.challenger_version:
            return NoCanary(f"challenger v{gate.challenger_version} has had its canary ({name})")
    for name, body in canaries.items():
        status = (body.get("state") or {}).get("status", "not started")
        if body.get("model") == model and status not in ("promoted", "rolled_back"):
            return NoCanary(f"canary {name} is unfinished ({status}): one at a time")
    if champion_version != gate.champion_version:
        return NoCanary(
            f"the gate compared with v{gate.champion_version}, but v{champion_version} is champion now: judge again"
        )
    origin = {
        "trigger": "drift",
        "drift_window": gate.drift_window,
        "drift_event": gate.drift_event,
        "challenger_run": gate.challenger_run,
        "evaluation_event": gate.evaluation_event,
        "gate_month": gate.gate_month,
        "gate": gate.reason,
    }
    body = {
        "model": model,
        "champion_version": gate.champion_version,
        "challenger_version": gate.challenger_version,
        **LOOP_CANARY,
        "progress_deadline_s": LOOP_CANARY["progress_deadline_s"] + label_delay_s,
        "shadow_max_s": LOOP_CANARY["shadow_max_s"] + label_delay_s,  # the shadow is judged on realized labels too
        "loss": loss,  # the model's per-request loss, as the canary's quality check names it
        "origin": origin,
        # quality before the labels, acted on only once the use case's estimates earned it (keel/loop/estimate.py)
        **({"estimate": estimate} if estimate else {}),
    }
    if not shadow:  # served from the first step; its quality is the gate's, on realized labels it never trained on
        body = {k: v for k, v in body.items() if k not in ("shadow", "shadow_max_s")}
        body |= {"steps": [s for s in LOOP_CANARY["steps"] if s > 0], "gate_judged": True}
    reason = (
        f"challenger v{gate.challenger_version} passed its gate on {gate.gate_month} ({gate.reason}); "
        f"drift in {gate.drift_window}: canary started"
    )
    return StartCanary(canary_name(model, gate.challenger_version), body, reason)
