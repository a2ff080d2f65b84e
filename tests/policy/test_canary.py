"""Table tests of the canary controller's decisions (keel.canary.decide): what it does with each kind of evidence."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from keel.canary import decide, log_loss_pvalue, rate_ratio_pvalue
from keel.canary_plan import PAUSED, PROMOTED, ROLLED_BACK, RUNNING, ArmStats, CanaryPlan, CanaryState
from keel.policies import validate_policy

PLAN = CanaryPlan(
    steps=(1, 10, 30, 50, 100),
    interval_s=60,
    min_samples=200,
    error_ratio=1.2,
    alpha=0.05,
    max_log_loss_increase=0.02,
    min_labelled=200,
    progress_deadline_s=3600,
    p99_target_ms=50,
)
T0 = 1_000_000.0
GOOD = ArmStats(requests=400, errors=1, p99_ms=8.0, labelled=300, log_loss=0.45, log_loss_var=0.25)
CHAMP = ArmStats(requests=40_000, errors=100, p99_ms=8.0, labelled=30_000, log_loss=0.45, log_loss_var=0.25)


def state(step=0, held=120.0, started=None, status=RUNNING):
    return CanaryState(
        status=status, step=step, started_at=T0 - 600 if started is None else started, step_started_at=T0 - held
    )


def test_rate_ratio_test_matches_the_binomial_and_is_valid_at_small_counts():
    # 3 errors in 100 challenger requests vs 100 in 10,000: exact conditional binomial
    p = rate_ratio_pvalue(3, 100, 100, 10_000, 1.2)
    pi = 1.2 * 100 / (1.2 * 100 + 10_000)
    assert p == pytest.approx(stats.binom.sf(2, 103, pi))
    assert rate_ratio_pvalue(0, 100, 100, 10_000, 1.2) == 1.0  # no challenger error: no evidence against it
    assert rate_ratio_pvalue(0, 100, 0, 10_000, 1.2) == 1.0
    assert rate_ratio_pvalue(10, 100, 100, 10_000, 1.2) < 1e-4  # 10 % vs 1 %: clear
    # at 1 % traffic under H0 (same error rate) the test rejects at most α of the time
    import numpy as np

    rng = np.random.default_rng(0)
    rejects = sum(
        rate_ratio_pvalue(int(rng.binomial(200, 0.01)), 200, int(rng.binomial(20_000, 0.01)), 20_000, 1.0) < 0.05
        for _ in range(2000)
    )
    assert rejects / 2000 <= 0.05


@pytest.mark.parametrize("step", range(5))
def test_a_breach_at_each_step_rolls_back(step):
    bad = replace(GOOD, errors=40)  # 10 % vs the champion's 0.25 %
    d = decide(PLAN, state(step=step), bad, CHAMP, T0)
    assert d.action == "rollback" and d.state.status == ROLLED_BACK and d.percent == 0.0
    assert d.evidence["error_rate_pvalue"] < 0.05 and "error rate" in d.reasons[0]


@pytest.mark.parametrize(
    "challenger, champion, why",
    [
        (None, CHAMP, "no metrics"),  # the exposure-log provider failed
        (GOOD, None, "no metrics"),
        (ArmStats(0, 0), CHAMP, "0 challenger requests"),  # no traffic
        (replace(GOOD, requests=150), CHAMP, "150 challenger requests"),  # too few samples
        (replace(GOOD, p99_ms=math.nan), CHAMP, "p99 is missing or NaN"),
        (replace(GOOD, log_loss=math.nan), CHAMP, "log-loss or its variance is NaN"),
        (ArmStats(requests=-5, errors=0), CHAMP, "counts are not valid"),
        (ArmStats(requests=10, errors=20), CHAMP, "counts are not valid"),
    ],
)
def test_no_data_nan_and_inconclusive_hold_and_never_promote(challenger, champion, why):
    for step in (0, 4):  # even at the last step: hold, not promote
        d = decide(PLAN, state(step=step), challenger, champion, T0)
        assert d.action == "hold" and d.state == state(step=step), d
        assert any(why in r for r in d.reasons), d.reasons


def test_a_step_is_held_for_one_interval_then_advances():
    early = decide(PLAN, state(step=1, held=30), GOOD, CHAMP, T0)
    assert early.action == "hold" and "held 30 s of 60 s" in early.reasons[-1]
    d = decide(PLAN, state(step=1, held=60), GOOD, CHAMP, T0)
    assert d.action == "advance" and d.state.step == 2 and d.percent == 30 and d.state.step_started_at == T0


def test_the_last_step_promotes():
    d = decide(PLAN, state(step=4), GOOD, CHAMP, T0)
    assert d.action == "promote" and d.state.status == PROMOTED and d.percent == 100


def test_steps_that_do_not_divide_100():
    plan = replace(PLAN, steps=(3, 33, 67, 100))
    s = state(step=0)
    seen = []
    for tick in range(4):
        d = decide(plan, s, GOOD, CHAMP, T0 + tick * 61)
        seen.append((d.action, d.percent))
        s = d.state
    assert seen == [("advance", 33), ("advance", 67), ("advance", 100), ("promote", 100)]


def test_latency_and_quality_breaches():
    slow = decide(PLAN, state(), replace(GOOD, p99_ms=80.0), CHAMP, T0)
    assert slow.action == "rollback" and "SLA target" in slow.reasons[0]
    # both arms slow together (a busy host): not the challenger's fault — no rollback, and the evidence says why
    busy = decide(PLAN, state(), replace(GOOD, p99_ms=80.0), replace(CHAMP, p99_ms=75.0), T0)
    assert busy.action == "advance" and "the host, not the challenger" in busy.evidence["latency_note"]
    # …but a challenger much slower than a slow champion is still rolled back
    slower = decide(PLAN, state(), replace(GOOD, p99_ms=120.0), replace(CHAMP, p99_ms=75.0), T0)
    assert slower.action == "rollback" and "1.2× the champion's 75.0 ms" in slower.reasons[0]
    worse = decide(PLAN, state(), replace(GOOD, log_loss=0.60), CHAMP, T0)
    assert worse.action == "rollback" and "log-loss" in worse.reasons[0]
    assert worse.evidence["log_loss_pvalue"] < PLAN.alpha
    # +0.05 on 300 labels (standard error ≈ 0.029): above the margin, but not with confidence — no rollback
    noisy = decide(PLAN, state(), replace(GOOD, log_loss=0.50), CHAMP, T0)
    assert noisy.action == "advance" and 0.05 < noisy.evidence["log_loss_pvalue"] < 0.5
    no_var = decide(PLAN, state(), replace(GOOD, log_loss_var=None), CHAMP, T0)
    assert no_var.action == "hold" and "NaN" in no_var.reasons[0]
    few_labels = decide(PLAN, state(), replace(GOOD, log_loss=0.90, labelled=10), CHAMP, T0)
    assert few_labels.action == "advance"  # too few outcomes in to judge quality: other checks decide


def test_the_quality_test_is_welchs_z_and_holds_its_level():
    rng = np.random.default_rng(7)
    a, b = rng.gamma(2.0, 0.25, 400), rng.gamma(2.0, 0.25, 5000)
    chal = ArmStats(400, 0, 5.0, 400, float(a.mean()), float(a.var(ddof=1)))
    champ = ArmStats(5000, 0, 5.0, 5000, float(b.mean()), float(b.var(ddof=1)))
    se = math.sqrt(a.var(ddof=1) / 400 + b.var(ddof=1) / 5000)
    assert log_loss_pvalue(chal, champ, 0.02) == pytest.approx(stats.norm.sf((a.mean() - b.mean() - 0.02) / se))
    # Same-quality arms at the margin's edge: the false-rollback rate stays at most α.
    alarms = 0
    for _ in range(2000):
        a, b = rng.gamma(2.0, 0.25, 300), rng.gamma(2.0, 0.25, 3000)
        a = a + 0.02  # exactly the allowed increase: H0 holds
        chal = ArmStats(300, 0, 5.0, 300, float(a.mean()), float(a.var(ddof=1)))
        champ = ArmStats(3000, 0, 5.0, 3000, float(b.mean()), float(b.var(ddof=1)))
        alarms += log_loss_pvalue(chal, champ, 0.02) < 0.05
    assert alarms / 2000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)


def test_progress_deadline_rolls_back_and_pause_is_an_alternative():
    late = decide(PLAN, state(started=T0 - 4000, held=4000), ArmStats(0, 0), CHAMP, T0)
    assert late.action == "rollback" and "progress deadline" in late.reasons[0]
    # a deadline on progress: a step earned just now is not rolled back for the time the steps before it took
    # (a live year rolled back a challenger one tick after its shadow found it surely better)
    just_earned = decide(PLAN, state(step=1, started=T0 - 4000, held=30), ArmStats(0, 0), CHAMP, T0)
    assert just_earned.action == "hold"
    stuck = decide(PLAN, state(step=1, started=T0 - 8000, held=3700), ArmStats(0, 0), CHAMP, T0)
    assert stuck.action == "rollback" and "no step passed in 3600 s since step 1 began" in stuck.reasons[0]
    plan = replace(PLAN, on_breach="pause")
    d = decide(plan, state(), replace(GOOD, errors=40), CHAMP, T0)
    assert d.action == "pause" and d.state.status == PAUSED and d.percent == 1
    assert decide(plan, d.state, GOOD, CHAMP, T0 + 999).action == "none"  # paused stays paused


def test_duplicate_ticks_and_restarts_never_roll_back_twice_or_promote_after_a_breach():
    rolled = decide(PLAN, state(step=2), replace(GOOD, errors=40), CHAMP, T0).state
    for stats_ in (GOOD, replace(GOOD, errors=40), None):
        again = decide(PLAN, rolled, stats_, CHAMP, T0 + 5)  # a duplicate or replayed tick
        assert again.action == "none" and again.state == rolled
    promoted = decide(PLAN, state(step=4), GOOD, CHAMP, T0).state
    assert decide(PLAN, promoted, replace(GOOD, errors=40), CHAMP, T0 + 5).action == "none"
    # A daemon restart mid-rollout starts from the stored state: the same state and evidence give the same decision.
    mid = state(step=2)
    assert decide(PLAN, mid, GOOD, CHAMP, T0) == decide(PLAN, mid, GOOD, CHAMP, T0)


def test_plan_from_a_committed_canary_policy():
    body = {
        "model": "m",
        "champion_version": 1,
        "challenger_version": 2,
        "steps": [5, 50, 100],
        "interval_s": 30,
        "min_samples": 50,
        "alpha": 0.01,
        "latency_ratio": 3.0,
        "on_breach": "pause",
    }
    validate_policy("c", "canary", body, lambda model: {1, 2})  # every key a plan reads can be committed
    plan = CanaryPlan.from_policy(body, p99_target_ms=15)
    assert plan.steps == (5, 50, 100) and plan.interval_s == 30 and plan.alpha == 0.01 and plan.p99_target_ms == 15
    assert plan.latency_ratio == 3.0


def test_no_challenger_gets_all_the_traffic_before_its_quality_is_judged():
    """The clock can run ahead of the outcomes (a live replay builds a day's flights after it flew): steps on too few
    labels advance on errors and latency — but the move to 100 %, where no champion traffic is left to compare with,
    and the promotion hold until some step's quality verdict found no breach. (The live year's inverted challenger
    was promoted before this, on a fast clock.)"""
    unlabelled = replace(GOOD, labelled=5)
    early = decide(PLAN, state(step=1), unlabelled, CHAMP, T0)
    assert early.action == "advance" and early.state.quality_judged is False  # 10 % → 30 %: on errors and latency
    held = decide(PLAN, state(step=3), unlabelled, CHAMP, T0)  # 50 % → 100 % without a verdict
    assert held.action == "hold" and "quality not judged yet" in held.reasons[-1]
    judged = decide(PLAN, state(step=3), GOOD, CHAMP, T0)  # this step's labels are in: judged, no breach
    assert judged.action == "advance" and judged.percent == 100 and judged.state.quality_judged is True
    # at 100 % the champion serves nothing: the verdict carried from the step before is what promotes
    alone = ArmStats(requests=0, errors=0, p99_ms=math.nan, labelled=0)
    d = decide(replace(PLAN, p99_target_ms=None), judged.state, replace(GOOD, labelled=0), alone, T0 + 61)
    assert d.action == "promote" and d.state.quality_judged is True
    never = decide(replace(PLAN, p99_target_ms=None), state(step=4), replace(GOOD, labelled=0), alone, T0)
    assert never.action == "hold" and "quality not judged yet" in never.reasons[-1]
    # a verdict that is a breach is a rollback, never a judged pass
    worse = decide(PLAN, state(step=3), replace(GOOD, log_loss=0.60), CHAMP, T0)
    assert worse.action == "rollback" and worse.state.quality_judged is False


def test_slower_than_the_objective_is_judged_as_a_rate_not_by_a_few_requests_p99():
    """With per-request latencies counted, the latency check is a rate: a challenger breaches only when its share of
    answers slower than the SLA target is above the objective's 1 % (× latency_ratio) with confidence and above the
    champion's share likewise — the p99 of 40 requests is their slowest one, and a busy host slows both arms."""
    plan = replace(PLAN, min_samples=20)
    champ = replace(CHAMP, answered=39_900, slow=400)  # the champion: 1.0 % slower than the 50 ms target
    one_slow = replace(GOOD, requests=40, errors=0, answered=40, slow=1, p99_ms=80.0)  # p99 over target: one request
    ok = decide(plan, state(), one_slow, champ, T0)
    assert ok.action == "advance" and ok.evidence["slow_objective_pvalue"] > plan.alpha
    busy_host = decide(plan, state(), replace(one_slow, slow=14), replace(champ, slow=13_000), T0)  # both ~33 %
    assert busy_host.action == "advance" and "the host, not the challenger" in busy_host.evidence["latency_note"]
    slow = decide(plan, state(), replace(one_slow, slow=14), champ, T0)  # 35 % against the champion's 1 %
    assert slow.action == "rollback" and "14/40 answers slower than the SLA target 50" in slow.reasons[0]
    alone = decide(plan, state(step=4), replace(one_slow, slow=14), replace(CHAMP, requests=0, errors=0), T0)
    assert alone.action == "rollback" and "objective" in alone.reasons[0]  # no champion left: the objective alone


def test_the_shadow_step_decides_on_the_paired_verdict_alone():
    from keel.canary import decide
    from keel.canary_plan import CanaryPlan, CanaryState
    from keel.loop.shadow import ShadowPolicy, ShadowVerdict

    plan = CanaryPlan(steps=(0, 25, 100), shadow=ShadowPolicy(), shadow_max_s=100.0, min_samples=30)
    state = CanaryState(started_at=0.0, step_started_at=0.0)
    better = ShadowVerdict(True, "better", 900, 6, "log_loss", -0.01, 0.002, -0.006, 0.001)
    unsure = ShadowVerdict(False, "not surely", 900, 6, "log_loss", -0.001, 0.002, 0.003, 0.3)
    worse = ShadowVerdict(False, "worse", 900, 6, "log_loss", 0.02, 0.002, 0.024, 1.0)
    assert decide(plan, state, None, None, 10.0, None).action == "hold"  # no evidence: never served on a guess
    d = decide(plan, state, None, None, 10.0, better)
    assert (d.action, d.percent, d.state.quality_judged) == ("advance", 25.0, True)  # quality judged in shadow
    assert decide(plan, state, None, None, 10.0, worse).action == "rollback"  # surely worse: no wait
    assert decide(plan, state, None, None, 50.0, unsure).action == "hold"
    late = decide(plan, state, None, None, 101.0, unsure)
    assert late.action == "rollback" and "not better in shadow" in late.reasons[0]
    served = CanaryState(started_at=0.0, step_started_at=10.0, step=1, quality_judged=True)
    assert not plan.in_shadow(served)  # after the shadow step the arms' exposures decide, as for any canary


def test_the_shadows_clock_starts_when_the_challenger_first_scores_not_at_the_commit():
    """On a busy machine the deployment that loads the challenger may run days after the canary's commit: its
    shadow is judged over ``shadow_max_s`` from its first score, and it is rolled back as never answering only past
    the progress deadline from the commit."""
    from keel.canary import decide
    from keel.canary_plan import CanaryPlan, CanaryState
    from keel.loop.shadow import ShadowPolicy, ShadowVerdict

    plan = CanaryPlan(steps=(0, 25, 100), shadow=ShadowPolicy(), shadow_max_s=100.0, progress_deadline_s=300.0)
    state = CanaryState(started_at=0.0, step_started_at=0.0)
    none_yet = ShadowVerdict(False, "0 labelled rows", 0, 0, "log_loss")
    unsure = ShadowVerdict(False, "not surely", 900, 6, "log_loss", -0.001, 0.002, 0.003, 0.3)
    waiting = decide(plan, state, None, None, 150.0, none_yet)  # past shadow_max_s from the commit, never scored
    assert waiting.action == "hold" and "has not scored yet" in waiting.reasons[0]
    late = decide(plan, state, None, None, 150.0, unsure, first_answer=120.0)  # first score at 120: 30 s of shadow
    assert late.action == "hold" and late.state.armed_at == 120.0
    assert decide(plan, state, None, None, 221.0, unsure, first_answer=120.0).action == "rollback"  # 101 s after it
    never = decide(plan, state, None, None, 301.0, none_yet)
    assert never.action == "rollback" and "never scored in shadow" in never.reasons[0]


def test_a_shadow_whose_labels_lag_the_clock_is_judged_on_the_days_they_cover():
    """On a busy machine labels are built late: at the shadow's limit its pairs may have no labels yet ("0 labelled
    rows") — judged "not better" only once the labels cover half the limit, or at twice the limit whatever they
    cover; surely better or worse is decided at once, as always."""
    from dataclasses import replace

    from keel.canary import decide
    from keel.canary_plan import CanaryPlan, CanaryState
    from keel.loop.shadow import ShadowPolicy, ShadowVerdict

    plan = CanaryPlan(steps=(0, 25, 100), shadow=ShadowPolicy(), shadow_max_s=100.0, progress_deadline_s=300.0)
    state = CanaryState(started_at=0.0, step_started_at=0.0)
    no_labels = ShadowVerdict(False, "0 labelled rows", 0, 0, "log_loss", labelled_span_s=0.0)
    few_days = replace(no_labels, reason="not surely", labelled=300, clusters=3, labelled_span_s=30.0)
    covered = replace(few_days, clusters=6, labelled_span_s=60.0)
    lagging = decide(plan, state, None, None, 130.0, no_labels, first_answer=10.0)
    assert lagging.action == "hold" and "labels cover 0 of its" in lagging.reasons[0]
    assert decide(plan, state, None, None, 130.0, few_days, first_answer=10.0).action == "hold"
    judged = decide(plan, state, None, None, 130.0, covered, first_answer=10.0)
    assert judged.action == "rollback" and "not better in shadow within" in judged.reasons[0]
    never = decide(plan, state, None, None, 211.0, no_labels, first_answer=10.0)  # twice the limit: judged anyway
    assert never.action == "rollback" and "0 labelled rows" in never.reasons[0]
    better = replace(few_days, better=True, reason="better")
    assert decide(plan, state, None, None, 130.0, better, first_answer=10.0).action == "advance"


def test_a_paired_plan_judges_quality_on_the_same_requests():
    from keel.canary import decide
    from keel.canary_plan import ArmStats, CanaryPlan, CanaryState
    from keel.loop.shadow import ShadowVerdict

    plan = CanaryPlan(steps=(10, 100), interval_s=10, min_samples=20, min_labelled=30, paired=True)
    state = CanaryState(started_at=0.0, step_started_at=0.0)
    arms = ArmStats(requests=40, errors=0), ArmStats(requests=400, errors=0)
    twin = ShadowVerdict(False, "same", 300, 6, "log_loss", 0.0, 0.0, 0.0, 1.0)  # identical on every request
    worse = ShadowVerdict(False, "worse", 300, 6, "log_loss", 0.9, 0.05, 0.99, 1.0)
    noisy = ShadowVerdict(False, "worse?", 300, 6, "log_loss", 0.05, 0.04, 0.13, 1.0)
    d = decide(plan, state, *arms, 20.0, paired=twin)
    assert (d.action, d.state.quality_judged) == ("advance", True)  # judged on pairs: may take all the traffic
    d = decide(plan, state, *arms, 20.0, paired=worse)
    assert d.action == "rollback" and d.evidence["log_loss_increase"] == 0.9 and d.evidence["log_loss_pvalue"] < 0.05
    d = decide(plan, state, *arms, 20.0, paired=noisy)
    assert d.action == "advance" and d.evidence["log_loss_pvalue"] > 0.05  # not surely worse by more than 0.02
    few = ShadowVerdict(False, "few", 12, 2, "log_loss", 0.9, 0.05, 0.99, 1.0)
    assert decide(plan, state, *arms, 20.0, paired=few).action == "hold"  # 12 pairs: neither breach nor judged


def test_a_surely_worse_estimate_rolls_a_step_back_before_any_label_only_when_the_plan_trusts_it():
    from keel.loop.estimate import Estimate, compare
    from keel.loop.shadow import ShadowPolicy

    trusting = replace(PLAN, estimate={"metric": "log_loss", "margin": 0.02, "alpha": 0.01, "trust": "held 3 months"})
    no_labels = replace(GOOD, labelled=0, log_loss=None, log_loss_var=None)
    champ = replace(CHAMP, labelled=0, log_loss=None, log_loss_var=None)
    worse = compare(Estimate("log_loss", 0.62, 0.005, 400), Estimate("log_loss", 0.50, 0.002, 4000), 0.02)
    same = compare(Estimate("log_loss", 0.505, 0.005, 400), Estimate("log_loss", 0.50, 0.002, 4000), 0.02)
    assert worse.worse and not same.worse
    d = decide(trusting, state(step=1), no_labels, champ, T0, estimate=worse)
    assert d.action == "rollback" and d.reasons[0].startswith("estimated log_loss surely worse before its labels")
    assert d.evidence["estimate"]["challenger"] == pytest.approx(0.62)
    assert decide(PLAN, state(step=1), no_labels, champ, T0, estimate=worse).action == "advance"  # not trusted
    assert decide(trusting, state(step=1), no_labels, champ, T0, estimate=same).action == "advance"
    shadow = replace(trusting, steps=(0, 25, 100), shadow=ShadowPolicy())
    assert decide(shadow, state(step=0), None, None, T0, estimate=worse).action == "rollback"  # in shadow too
    sure = compare(Estimate("log_loss", 0.48, 0.003, 400), Estimate("log_loss", 0.50, 0.002, 4000), 0.02)
    early = decide(shadow, state(step=0), None, None, T0, estimate=sure)  # no label yet: the shadow alone would hold
    assert early.action == "advance" and early.percent == 25 and not early.state.quality_judged
    assert early.reasons[0].startswith("estimated log_loss not worse before its labels")
    assert decide(replace(shadow, estimate=None), state(step=0), None, None, T0, estimate=sure).action == "hold"


def test_a_canarys_estimate_setting_is_validated_when_committed():
    from keel.policies import PolicyValidationError

    body = {"model": "m", "champion_version": 1, "challenger_version": 2, "interval_s": 30}
    good = {"metric": "log_loss", "margin": 0.02, "alpha": 0.01, "trust": "held 3 months"}
    validate_policy("c", "canary", body | {"estimate": good}, lambda model: {1, 2})
    assert CanaryPlan.from_policy(body | {"estimate": good}).estimate == good
    for bad, rule in (
        ({**good, "metric": "accuracy"}, "estimate_shape"),
        ({**good, "extra": 1}, "estimate_shape"),
        ({**good, "margin": -1}, "estimate_margin"),
        ({**good, "alpha": 0.9}, "estimate_alpha"),
        ("log_loss", "estimate_shape"),
    ):
        with pytest.raises(PolicyValidationError) as err:
            validate_policy("c", "canary", body | {"estimate": bad}, lambda model: {1, 2})
        assert err.value.rule.startswith(rule), (bad, err.value.rule)
