"""Canary decisions: compare a challenger with the champion and decide — advance, hold, promote, roll back, pause.

Pure: ``decide(plan, state, challenger, champion, now)`` looks only at its arguments, so every case (no traffic,
NaN metrics, a breach at each step, a duplicate tick, a restarted daemon) is a table test. The sensor turns the
decision into a policy commit; the commit is the action.

The three checks, each on the exposures of the current step only:

- **error rate** — roll back when the challenger's error rate exceeds ``error_ratio`` (1.2) × the champion's with
  confidence: a one-sided exact conditional test of the rate ratio (given k errors in all, the challenger's count
  is Binomial(k, π) with π = r·n_c / (r·n_c + n_h) under H0: rate_c ≤ r·rate_h), p < ``alpha``. Exact at small
  counts, so it is valid at 1 % traffic;
- **latency** — as a rate: the challenger's share of answers slower than its SLA tier's p99 target above the
  objective's 1 % (× ``latency_ratio``) with confidence, and above ``latency_ratio`` (1.2) × the champion's share in
  the same window with confidence (``latency_rate_breach``: exact binomial tests, as the error check): when both arms
  miss the target together, the machine is slow, not the challenger (a busy host would otherwise roll back every
  canary); at the last step, where the champion answers nothing, its answers in the window before the step stand
  in. Evidence with p99s only (no per-request latencies) compares the p99s under the same two conditions;
- **quality** — on requests whose outcome is in, the challenger's loss (log-loss for a binary label) above the champion's by more than
  ``max_log_loss_increase`` with confidence: a one-sided Welch z-test of the mean per-request log-loss difference
  (H0: Δ ≤ max_log_loss_increase), p < ``alpha`` — a few unlucky labels do not roll a good model back.

No data, too few samples, NaN → hold (never promote). A step advances only after ``interval_s`` *and*
``min_samples`` challenger requests with no breach; the last step (100 %) promotes. Quality must have been judged
before the challenger gets all the traffic: a step on fewer than ``min_labelled`` realized labels per arm may
advance on errors and latency, but the move to the last step (where no champion traffic is left to compare with)
and the promotion wait — hold — until some step's quality verdict, on enough labels, found no breach
(``quality_judged``; a clock that runs ahead of the labels otherwise promotes a model nobody has judged). A step
that has not passed ``progress_deadline_s`` after it began (the first: after the challenger first answered) → roll
back. ``on_breach: pause`` pauses instead of rolling back. A finished rollout (promoted,
rolled back) never changes again, so a duplicate tick or a replayed one cannot roll back twice or promote after a
breach.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any

from scipy.stats import binom

from keel.canary_estimate import early_on_an_estimate, on_a_worse_estimate
from keel.canary_plan import (
    FINISHED,
    PAUSED,
    PROMOTED,
    ROLLED_BACK,
    ArmStats,
    CanaryPlan,
    CanaryState,
    Decision,
)
from keel.loop.estimate import EstimateVerdict
from keel.loop.shadow import ShadowVerdict, worse_pvalue

OBJECTIVE_SLOW_SHARE = 0.01  # a p99 target: at most 1 % of the answers slower than it


def latency_rate_breach(
    plan: CanaryPlan, challenger: ArmStats, champion: ArmStats, evidence: dict, reference: str = "the champion's"
) -> list[str]:
    """Slower than the SLA target, as a rate (exact tests, as the error check): the challenger breaches only when
    its share of answers slower than the target is above the objective's 1 % with confidence *and* above
    ``latency_ratio`` × the champion's share in the same window with confidence (when the champion answered) — a
    busy host slows both arms alike, and a p99 of a few dozen requests is their slowest one, not a rate. A step
    where the champion has no answers (the last, at 100 %) passes ``champion`` as its answers in the window before
    the step (``reference`` says so): the same host's recent latency, not the objective alone."""
    c_slow, c_n, h_slow, h_n = challenger.slow or 0, challenger.answered, champion.slow or 0, champion.answered
    if c_n < plan.min_samples:
        return []
    p_objective = float(binom.sf(c_slow - 1, c_n, min(1.0, plan.latency_ratio * OBJECTIVE_SLOW_SHARE)))
    p_champion = (
        rate_ratio_pvalue(c_slow, c_n, h_slow, h_n, plan.latency_ratio) if h_n and champion.slow is not None else 0.0
    )
    evidence |= {"slow_share": {"challenger": c_slow / c_n, "champion": h_slow / h_n if h_n else None},
                 "slow_objective_pvalue": p_objective, "slow_vs_champion_pvalue": p_champion}  # fmt: skip
    if p_objective >= plan.alpha or p_champion >= plan.alpha:
        if p_objective < plan.alpha:
            evidence["latency_note"] = (
                f"the challenger and {reference} answers slower than the SLA target {plan.p99_target_ms} ms "
                f"({c_slow}/{c_n} vs {h_slow}/{h_n}): the host, not the challenger"
            )
        return []
    versus = f" and above {plan.latency_ratio}× {reference} {h_slow}/{h_n} (p = {p_champion:.3g})" if h_n else ""
    return [
        f"{c_slow}/{c_n} answers slower than the SLA target {plan.p99_target_ms} ms: above the objective's "
        f"{plan.latency_ratio * OBJECTIVE_SLOW_SHARE:.1%} with p = {p_objective:.3g} < α = {plan.alpha}{versus}"
    ]


def rate_ratio_pvalue(chal_errors: int, chal_n: int, champ_errors: int, champ_n: int, ratio: float) -> float:
    """One-sided p-value for H0: challenger error rate ≤ ratio × champion's, given the counts (exact, conditional
    on the total error count). 1.0 when there are no errors at all (nothing suggests a worse challenger)."""
    k = chal_errors + champ_errors
    if chal_n <= 0 or champ_n <= 0 or k == 0:
        return 1.0
    pi = ratio * chal_n / (ratio * chal_n + champ_n)
    return float(binom.sf(chal_errors - 1, k, pi))


def log_loss_pvalue(chal: ArmStats, champ: ArmStats, margin: float) -> float:
    """One-sided p-value for H0: challenger log-loss − champion log-loss ≤ margin (Welch z on the per-request
    means; the labelled counts here are hundreds or more, where the normal approximation holds). NaN when a
    variance is missing."""
    from scipy.stats import norm

    if not (_finite(chal.log_loss_var) and _finite(champ.log_loss_var)):
        return float("nan")
    se = math.sqrt(chal.log_loss_var / chal.labelled + champ.log_loss_var / champ.labelled)
    delta = chal.log_loss - champ.log_loss - margin
    if se == 0:
        return 0.0 if delta > 0 else 1.0
    return float(norm.sf(delta / se))


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


LABELS_COVER = 0.5  # a shadow past its limit is judged "not better" once its labels cover this share of the limit


def decide_shadow(plan: CanaryPlan, state: CanaryState, verdict: ShadowVerdict | None, now: float,
                  armed_at: float | None = None) -> Decision:  # fmt: skip
    """The shadow step: advance on a challenger surely better on the same requests (quality judged), roll back one
    surely worse or not better within ``shadow_max_s`` of its first shadow score (``armed_at``), else hold — "not
    better" only once its labelled pairs cover ``LABELS_COVER`` of that time (labels lag the clock on a busy
    machine: a shadow with no labels yet is not judged on them), or at twice ``shadow_max_s`` whatever they cover. One
    that has not scored at all yet (its deployment still to run) holds — until the progress deadline from the
    commit, when it is rolled back as never answering."""
    evidence: dict[str, Any] = {
        "step": state.step,
        "percent": 0.0,
        "shadow": verdict.as_metadata() if verdict else None,
    }
    if armed_at is None and verdict is not None and verdict.labelled > 0:
        armed_at = state.step_started_at  # it scored, when is not known: the step's start, the earliest it could
    if armed_at is None:
        limit = max(plan.progress_deadline_s, plan.shadow_max_s)
        if now - state.started_at > limit:
            return Decision("rollback", replace(state, status=ROLLED_BACK), 0.0, (
                f"the challenger never scored in shadow within {limit / 86400:g} days of the commit (not deployed?)",
            ), evidence)  # fmt: skip
        return Decision("hold", state, 0.0, ("in shadow: the challenger has not scored yet (its deployment is still "
                                             "to run): the shadow's clock starts at its first score",), evidence)  # fmt: skip
    state = replace(state, armed_at=armed_at)
    if verdict is None:
        reason = "no paired shadow scores yet (exposure log or labels unavailable)"
    elif verdict.better:
        nxt = replace(state, step=state.step + 1, step_started_at=now, quality_judged=True)
        return Decision("advance", nxt, plan.steps[nxt.step], (f"better in shadow: {verdict.reason}",), evidence)
    elif verdict.se is not None and verdict.upper is not None and 2 * verdict.delta - verdict.upper > 0:
        return Decision("rollback", replace(state, status=ROLLED_BACK), 0.0,
                        (f"surely worse in shadow: {verdict.reason}",), evidence)  # fmt: skip
    else:
        reason = verdict.reason
    shadowed = now - max(state.step_started_at, armed_at)
    if shadowed > plan.shadow_max_s:
        covered = verdict.labelled_span_s if verdict is not None else None
        if covered is not None and covered < LABELS_COVER * plan.shadow_max_s and shadowed <= 2 * plan.shadow_max_s:
            # labels lag the clock (a busy machine builds them late): judged on the days they cover, not on the clock
            return Decision("hold", state, 0.0, (
                f"in shadow: its labels cover {covered / 86400:g} of its {plan.shadow_max_s / 86400:g} days so far — "
                f"judged once they cover {LABELS_COVER:.0%} of them, or at {2 * plan.shadow_max_s / 86400:g} days: "
                f"{reason}",), evidence)  # fmt: skip
        return Decision("rollback", replace(state, status=ROLLED_BACK), 0.0, (
            f"not better in shadow within {plan.shadow_max_s / 86400:g} days of its first score: {reason}",),
            evidence)  # fmt: skip
    return Decision("hold", state, 0.0, (f"in shadow: {reason}",), evidence)


def paired_quality(plan: CanaryPlan, paired: ShadowVerdict | None, evidence: dict, breaches: list[str]) -> bool:
    """The quality guard on the step's paired rows (the champion's answers the challenger scored in shadow): a breach
    when the challenger is surely worse by more than ``max_log_loss_increase``; judged (True) when it surely is
    not, on at least ``min_labelled`` labelled pairs. Too few pairs: not judged, and no reason to hold."""
    if paired is None or paired.labelled < plan.min_labelled:
        return False
    p = worse_pvalue(paired, plan.max_log_loss_increase)
    evidence |= {"paired": paired.as_metadata(), "log_loss_increase": paired.delta, "log_loss_pvalue": p}
    if not math.isfinite(p):  # one hour of pairs, say: no variance to judge with yet
        return False
    if p < plan.alpha:
        breaches.append(
            f"{plan.loss} worse by {paired.delta:.4f} on {paired.labelled} paired realized labels over "
            f"{paired.clusters} hours: above +{plan.max_log_loss_increase} with p = {p:.3g} < α = {plan.alpha}"
        )
        return False
    return True


def decide(
    plan: CanaryPlan,
    state: CanaryState,
    challenger: ArmStats | None,
    champion: ArmStats | None,
    now: float,
    shadow: ShadowVerdict | None = None,
    paired: ShadowVerdict | None = None,
    first_answer: float | None = None,
    champion_before: ArmStats | None = None,
    estimate: EstimateVerdict | None = None,
) -> Decision:
    """The decision for one tick. In the shadow step (``plan.in_shadow``) ``shadow`` — the paired verdict on the
    requests both scored — decides (``decide_shadow``); every other step is judged on its arms' exposures, and its
    quality — for a ``paired`` plan — on ``paired``, the champion's answers the challenger scored in shadow.
    ``first_answer``: when the challenger first answered or scored in shadow in this rollout (from the exposure log;
    ``state.armed_at`` once recorded): the rollout's clocks start there. ``champion_before``: the champion's answers in
    the window before this step — the latency reference of a step where the champion answers nothing.
    ``estimate``: the two arms judged on their estimated quality (keel/loop/estimate.py) — acted on only when the
    plan says so (``plan.estimate``): surely worse rolls the step back before any label."""
    pct = state.percent(plan)
    if state.status in FINISHED:
        return Decision("none", state, pct, (f"rollout already {state.status}",))
    if state.status == PAUSED:
        return Decision("none", state, pct, ("rollout paused: an operator resumes or rolls back",))
    if (stop := on_a_worse_estimate(plan, state, estimate)) is not None:
        return stop
    armed_at = state.armed_at if state.armed_at is not None else first_answer
    if plan.in_shadow(state):
        d = decide_shadow(plan, state, shadow, now, armed_at)
        return early_on_an_estimate(plan, state, d, estimate, now, armed_at) if d.action == "hold" else d
    state = replace(state, armed_at=armed_at)

    evidence: dict[str, Any] = {"step": state.step, "percent": pct}
    judged_now = False
    breaches: list[str] = []
    inconclusive: list[str] = []
    if challenger is None or champion is None:
        inconclusive.append("no metrics from the exposure log (provider error or no data)")
    else:
        evidence |= {"challenger": asdict(challenger), "champion": asdict(champion)}  # every ArmStats field
        counts = (challenger.requests, challenger.errors, champion.requests, champion.errors)
        if (
            any(not isinstance(c, int) or c < 0 for c in counts)
            or challenger.errors > challenger.requests
            or champion.errors > champion.requests
        ):
            inconclusive.append(f"counts are not valid: {counts}")
        else:
            # error rate: exact one-sided rate-ratio test
            p = rate_ratio_pvalue(
                challenger.errors, challenger.requests, champion.errors, champion.requests, plan.error_ratio
            )
            evidence["error_rate_pvalue"] = p
            evidence["challenger_error_rate"] = (
                challenger.errors / challenger.requests if challenger.requests else None
            )
            evidence["champion_error_rate"] = champion.errors / champion.requests if champion.requests else None
            if p < plan.alpha:
                breaches.append(
                    f"error rate {challenger.errors}/{challenger.requests} vs champion {champion.errors}/"
                    f"{champion.requests}: above {plan.error_ratio}x with p = {p:.3g} < α = {plan.alpha}"
                )
            # latency against the SLA tier
            if plan.p99_target_ms is not None and challenger.slow is not None and challenger.answered:
                reference, whose = champion, "the champion's"
                if not champion.answered and champion_before is not None and champion_before.answered:
                    reference, whose = champion_before, "the champion's before this step"
                    evidence["champion_before"] = asdict(champion_before)
                breaches += latency_rate_breach(plan, challenger, reference, evidence, whose)
            elif plan.p99_target_ms is not None:  # only p99s known (no per-request latencies): compare those
                if _finite(challenger.p99_ms):
                    slow = challenger.requests >= plan.min_samples and challenger.p99_ms > plan.p99_target_ms
                    champion_as_slow = _finite(champion.p99_ms) and challenger.p99_ms <= plan.latency_ratio * (
                        champion.p99_ms
                    )
                    if slow and champion_as_slow:
                        evidence["latency_note"] = (
                            f"both arms above the SLA target {plan.p99_target_ms} ms (challenger p99 "
                            f"{challenger.p99_ms:.1f}, champion {champion.p99_ms:.1f}): the host, not the challenger"
                        )
                    elif slow:
                        breaches.append(
                            f"p99 {challenger.p99_ms:.1f} ms above the SLA target {plan.p99_target_ms} ms"
                            + (f" and {plan.latency_ratio}× the champion's {champion.p99_ms:.1f} ms"
                               if _finite(champion.p99_ms) else "")
                        )  # fmt: skip
                elif challenger.requests:
                    inconclusive.append("challenger p99 is missing or NaN")
            # quality on realized labels: paired on the same requests when the challenger scored them in shadow,
            # else the arms' disjoint samples
            if plan.paired:
                judged_now = paired_quality(plan, paired, evidence, breaches)
            elif challenger.labelled >= plan.min_labelled and champion.labelled >= plan.min_labelled:
                p_loss = (
                    log_loss_pvalue(challenger, champion, plan.max_log_loss_increase)
                    if _finite(challenger.log_loss) and _finite(champion.log_loss)
                    else float("nan")
                )
                if math.isfinite(p_loss):
                    delta = challenger.log_loss - champion.log_loss
                    evidence["log_loss_increase"] = delta
                    evidence["log_loss_pvalue"] = p_loss
                    judged_now = p_loss >= plan.alpha
                    if p_loss < plan.alpha:
                        breaches.append(
                            f"{plan.loss} {challenger.log_loss:.4f} vs champion {champion.log_loss:.4f} on "
                            f"{challenger.labelled} realized labels: +{delta:.4f}, above +{plan.max_log_loss_increase} "
                            f"with p = {p_loss:.3g} < α = {plan.alpha}"
                        )
                else:
                    inconclusive.append("log-loss or its variance is NaN")
            if challenger.requests < plan.min_samples:
                inconclusive.append(
                    f"{challenger.requests} challenger requests in this step, need {plan.min_samples}"
                )

    if breaches:
        if plan.on_breach == "pause":
            return Decision("pause", replace(state, status=PAUSED), pct, tuple(breaches), evidence)
        return Decision("rollback", replace(state, status=ROLLED_BACK), 0.0, tuple(breaches), evidence)
    # the deadline is on progress: from the step's start (the challenger's first answer, in the first step) — a step
    # just earned must not be rolled back for the time the steps before it took
    since = (
        "the challenger first answered"
        if armed_at is not None and armed_at >= state.step_started_at
        else ("the start" if state.step == 0 else f"step {state.step} began")
    )
    if now - max(state.started_at, armed_at or 0.0, state.step_started_at) > plan.progress_deadline_s:
        reason = f"progress deadline: no step passed in {plan.progress_deadline_s:g} s since {since}"
        return Decision("rollback", replace(state, status=ROLLED_BACK), 0.0, (reason,), evidence)
    held_for = now - state.step_started_at
    if held_for < plan.interval_s:
        inconclusive.append(f"step held {held_for:.0f} s of {plan.interval_s:g} s")
    judged = state.quality_judged or judged_now or plan.gate_judged
    evidence["quality_judged"] = judged
    if not judged and state.step + 2 >= len(plan.steps):
        inconclusive.append(
            f"quality not judged yet: no step has had {plan.min_labelled} realized labels in each arm — the "
            f"challenger gets all the traffic only once its quality is known"
        )
    if inconclusive:
        return Decision("hold", state, pct, tuple(inconclusive), evidence)
    if state.step + 1 >= len(plan.steps):
        return Decision(
            "promote", replace(state, status=PROMOTED, quality_judged=judged), 100.0,
            (f"all {len(plan.steps)} steps passed",), evidence,
        )  # fmt: skip
    nxt = replace(state, step=state.step + 1, step_started_at=now, quality_judged=judged)
    return Decision(
        "advance",
        nxt,
        plan.steps[nxt.step],
        (f"step {pct:g} % passed: {challenger.requests} requests, no breach",),
        evidence,
    )
