"""What a canary does with its arms' estimated quality before the labels (keel/loop/estimate.py; keel/canary.py
decides the rest). Acted on only when the canary's plan carries an ``estimate`` setting — given by the loop once the
use case's estimates held three reported months in a row (``keel.loop.estimate.canary_estimate``):

- surely worse by more than the margin: the step — the shadow step too — is rolled back at once (paused, with
  ``on_breach: pause``), before any label;
- surely not worse, in the shadow step that would otherwise hold for its labels: the challenger goes on to its first
  served step, where its realized labels judge it (``quality_judged`` stays False: the last step waits for them).
"""

from __future__ import annotations

from dataclasses import replace

from keel.canary_plan import PAUSED, ROLLED_BACK, CanaryPlan, CanaryState, Decision
from keel.loop.estimate import EstimateVerdict


def trusted(plan: CanaryPlan) -> str:
    return (plan.estimate or {}).get("trust", "by the policy")


def on_a_worse_estimate(plan: CanaryPlan, state: CanaryState, estimate: EstimateVerdict | None) -> Decision | None:
    """The rollback (or pause) of a step whose challenger is surely worse on its estimate; None otherwise."""
    if not (plan.estimate and estimate is not None and estimate.worse):
        return None
    e, pct = estimate, state.percent(plan)
    why = (
        f"estimated {e.metric} surely worse before its labels: {e.challenger:.4f} vs the champion's "
        f"{e.champion:.4f}, worse by {e.delta:+.4f} beyond the margin {plan.estimate['margin']} (p = "
        f"{e.p_worse:.3g}; trusted: {trusted(plan)})"
    )
    evidence = {"step": state.step, "percent": pct, "estimate": e.as_metadata()}
    if plan.on_breach == "pause":
        return Decision("pause", replace(state, status=PAUSED), pct, (why,), evidence)
    return Decision("rollback", replace(state, status=ROLLED_BACK), 0.0, (why,), evidence)


def early_on_an_estimate(
    plan: CanaryPlan,
    state: CanaryState,
    held: Decision,
    estimate: EstimateVerdict | None,
    now: float,
    armed_at: float | None,
) -> Decision:
    """A shadow step's ``held`` decision, or — trusted and surely not worse on the estimate — the advance to the
    first served step before its labels."""
    if not (plan.estimate and estimate is not None and estimate.not_worse):
        return held
    e, nxt = estimate, replace(state, armed_at=armed_at, step=1, step_started_at=now)
    why = (
        f"estimated {e.metric} not worse before its labels: {e.challenger:.4f} vs the champion's {e.champion:.4f} "
        f"(p = {e.p_not_worse:.3g}; trusted: {trusted(plan)}); its realized labels judge the next step"
    )
    return Decision("advance", nxt, plan.steps[1], (why,), {**held.evidence, "estimate": e.as_metadata()})
