"""The loop's decisions as tables: drift → a challenger or not (and on which months), challenger → through the gate
or not, a feature frozen or not and when its freeze ends. No Dagster, no clock: values in, values out. (Which landed
days rebuild which month: tests/loop/test_arrivals.py.)"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from keel.loop.freeze import ActiveFreeze, decide_freeze, freezes_to_clear
from keel.loop.gate import ChallengerGatePolicy, bootstrap_upper, challenger_gate
from keel.loop.promote import GateResult, NoCanary, StartCanary, start_canary
from keel.loop.reference import reference_window
from keel.loop.report import Release, champion_at, naive_window
from keel.loop.retrain import LoopState, NoRetrain, RetrainPlan, RetrainPolicy, plan_retrain
from keel.policies.types import validate_policy

Q1 = ("2013-01", "2013-02", "2013-03")


def months(a: int, b: int) -> tuple[str, ...]:
    return tuple(f"2013-{m:02d}" for m in range(a, b + 1))


@pytest.mark.parametrize(
    "state, expected",
    [
        # March labelled: three months to fit on and one to judge are not there yet
        (LoopState(labelled=months(1, 3), champion_trained_on=Q1), "need 3 to fit on and 1 to early-stop and judge"),
        # April labelled: fit on Jan–Mar, early-stop on April's first three weeks, judge on its last days
        (LoopState(labelled=months(1, 4), champion_trained_on=Q1), (months(1, 3), "2013-04")),
        # June: the rolling window moves
        (LoopState(labelled=months(1, 6), champion_trained_on=Q1), (months(3, 5), "2013-06")),
        # the champion learned from exactly Mar–Jun already: the same plan would reproduce it
        (LoopState(labelled=months(1, 6), champion_trained_on=months(3, 6)), "exactly"),
        # nothing labelled beyond what the champion learned from
        (LoopState(labelled=months(1, 5), champion_trained_on=months(1, 5)), "no labelled month beyond"),
        # one challenger at a time: coalesced while one trains, none while a canary runs
        (LoopState(labelled=months(1, 6), champion_trained_on=Q1, challenger_in_training="run-7"), "coalesced"),
        (LoopState(labelled=months(1, 6), champion_trained_on=Q1, canary_running="canary-3"), "canary is running"),
        # too little history to train and judge
        (LoopState(labelled=months(1, 2), champion_trained_on=()), "need 3 to fit on and 1 to early-stop and judge"),
        # labels arrive out of order: sorted, deduplicated
        (LoopState(labelled=("2013-05", "2013-01", "2013-03", "2013-02", "2013-04", "2013-05"), champion_trained_on=Q1),
         (months(2, 4), "2013-05")),
    ],
)  # fmt: skip
def test_drift_leads_to_one_challenger_on_the_recent_months(state, expected):
    decision = plan_retrain("2013-06", state)
    if isinstance(expected, str):
        assert isinstance(decision, NoRetrain) and expected in decision.reason, decision
    else:
        assert decision == RetrainPlan("2013-06", *expected)


def test_the_plan_key_names_the_data_so_the_same_challenger_is_asked_once():
    state = LoopState(labelled=months(1, 6), champion_trained_on=Q1)
    a, b = plan_retrain("2013-06", state), plan_retrain("2013-07", state)
    assert a.key == b.key == "2013-03..2013-05|2013-06"
    assert a.data_months == months(3, 6) and a.gate_from_day == 22  # two drift reports, same data: one challenger


def test_a_longer_window_by_policy():
    plan = plan_retrain("2013-09", LoopState(labelled=months(1, 9), champion_trained_on=Q1), RetrainPolicy(6))
    assert plan.train_months == months(3, 8) and plan.gate_month == "2013-09"


def flights(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 5, n)  # true lateness probabilities, ~0.29 on average
    y = (rng.random(n) < p).astype(float)
    return p, y


def test_a_better_challenger_passes_with_its_evidence():
    p, y = flights(20_000)
    stale = np.clip(p * 0.6 + 0.05, 0, 1)  # the champion: right order, wrong level (the world moved)
    v = challenger_gate(y, stale, p)
    assert v.passed and v.delta < -0.001 and v.delta_upper < -0.001 and v.rows == 20_000
    assert v.challenger_loss < v.champion_loss and "better by" in v.reason and v.loss == "log_loss"
    meta = v.as_metadata()
    assert meta["challenger_auc"] == pytest.approx(meta["champion_auc"])  # same ranking: the gain is calibration
    assert meta["challenger_log_loss"] == pytest.approx(v.challenger_loss)


@pytest.mark.parametrize(
    "make_challenger, expected",
    [
        (lambda p, rng: p.copy(), "not better"),  # the same model: no gain
        (lambda p, rng: np.clip(p + rng.normal(0, 0.002, p.size), 1e-6, 1 - 1e-6), "not"),  # noise-level
        (lambda p, rng: np.clip(1 - p, 1e-6, 1 - 1e-6), "worse"),  # inverted scores
        (lambda p, rng: np.clip(p * 0.5, 1e-6, 1), "worse"),  # badly calibrated
    ],
)
def test_no_gain_or_a_worse_challenger_is_held_back(make_challenger, expected):
    p, y = flights(20_000, seed=2)
    v = challenger_gate(y, p, make_challenger(p, np.random.default_rng(3)))
    assert not v.passed and expected in v.reason, v.reason


def test_too_few_labels_or_broken_scores_fail_closed():
    p, y = flights(500)
    assert "fewer than 1000" in challenger_gate(y, p, p).reason
    p, y = flights(5_000)
    broken = p.copy()
    broken[7] = np.nan
    v = challenger_gate(y, p, broken)
    assert not v.passed and "not finite" in v.reason
    with pytest.raises(ValueError, match="must align"):
        challenger_gate(y, p, p[:-1])


def test_the_verdict_is_deterministic_and_the_bound_agrees_with_the_normal_one():
    p, y = flights(10_000, seed=4)
    challenger = np.clip(p * 0.9 + 0.02, 0, 1)
    assert challenger_gate(y, p, challenger) == challenger_gate(y, p, challenger)
    d = np.random.default_rng(5).normal(0.01, 0.2, 10_000)
    normal = d.mean() + 1.6449 * d.std(ddof=1) / np.sqrt(d.size)
    assert bootstrap_upper(d, 0.05, 2000, seed=1) == pytest.approx(normal, abs=0.15 * d.std() / np.sqrt(d.size))


def test_the_margin_is_the_policy():
    p, y = flights(20_000, seed=6)
    champion = np.clip(p * 0.7 + 0.08, 0, 1)  # somewhat off
    loose = challenger_gate(y, champion, p, ChallengerGatePolicy(margin=0.0))
    strict = challenger_gate(y, champion, p, ChallengerGatePolicy(margin=0.05))
    assert loose.passed and not strict.passed and "not surely by the margin 0.05" in strict.reason


NOW = datetime(2013, 7, 2, 6, 0, tzinfo=UTC)


def test_a_feature_is_frozen_only_when_frozen_serves_better():
    p, y = flights(20_000, seed=7)
    live_broken = np.clip(p * 0.5 + 0.3, 0, 1)  # the live feature drags the scores off (drifted input)
    freeze = decide_freeze("temp", "2013-06", y, live_broken, p, NOW)
    assert freeze.freeze and freeze.expires_at == NOW + timedelta(days=30) and "2013-06" in freeze.reason
    assert freeze.frozen_log_loss < freeze.live_log_loss
    # drift on the input, but the model scores as well live: no freeze (a season, not a fault)
    keep = decide_freeze("temp", "2013-06", y, p, np.clip(p + 0.01, 0, 1), NOW)
    assert not keep.freeze and keep.expires_at is None and "not better" in keep.reason
    # too few labelled flights to know: no freeze
    assert not decide_freeze("temp", "2013-06", y[:100], p[:100], p[:100], NOW).freeze


@pytest.mark.parametrize(
    "active, now, promoted, expected",
    [
        # nothing ends before its expiry without a promotion
        ([ActiveFreeze("temp", "2013-06", NOW + timedelta(days=3))], NOW, None, {}),
        # expired
        ([ActiveFreeze("temp", "2013-06", NOW)], NOW, None, {"temp": "expired"}),
        # a model trained on June has learned June's drift: the freeze ends; May's model has not
        ([ActiveFreeze("temp", "2013-06", NOW + timedelta(days=9))], NOW, months(4, 6), {"temp": "trained on 2013-06"}),
        ([ActiveFreeze("temp", "2013-06", NOW + timedelta(days=9))], NOW, months(3, 5), {}),
        # each freeze on its own
        ([ActiveFreeze("temp", "2013-06", NOW + timedelta(days=9)), ActiveFreeze("humid", "2013-04", NOW)],
         NOW, months(1, 3), {"humid": "expired"}),
    ],
)  # fmt: skip
def test_freezes_end_on_expiry_or_when_a_promoted_model_learned_their_drift(active, now, promoted, expected):
    cleared = freezes_to_clear(active, now, promoted)
    assert set(cleared) == set(expected)
    for feature, why in expected.items():
        assert why in cleared[feature]


@pytest.mark.parametrize(
    "metadata, expected",
    [
        (None, Q1),  # no champion yet: the initial window
        ({"train_months": []}, Q1),
        ({"train_months": ["2013-05", "2013-03", "2013-04"]}, months(3, 5)),  # the serving model's own months
        # the month it early-stopped on is data it learned from too
        ({"train_months": ["2013-01", "2013-02"], "valid_month": "2013-03"}, Q1),
        ({"train_months": ["2013-05", "2013-06"], "valid_month": "2013-07"}, months(5, 7)),
    ],
)
def test_drift_is_judged_against_what_the_serving_model_was_trained_on(metadata, expected):
    assert reference_window(metadata, Q1) == expected


def test_a_malformed_training_window_is_named():
    with pytest.raises(ValueError, match="not YYYY-MM"):
        reference_window({"train_months": ["May"]}, Q1)


PASSED = GateResult(True, challenger_version=3, champion_version=1, gate_month="2013-06", reason="better by 0.01",
                    drift_window="2013-06", drift_event=42, challenger_run="run-9", evaluation_event=57)  # fmt: skip


@pytest.mark.parametrize(
    "gate, champion, canaries, expected",
    [
        (None, 1, {}, "no challenger"),
        (replace(PASSED, passed=False, reason="not better"), 1, {}, "did not pass its gate: not better"),
        # a canary was made for this challenger already (running, promoted or rolled back): never twice
        (PASSED, 1, {"flight-delay.loop-v3": {"model": "flight-delay", "challenger_version": 3,
                                              "state": {"status": "rolled_back"}}}, "has had its canary"),
        # one rollout at a time
        (PASSED, 1, {"ops-rollout": {"model": "flight-delay", "challenger_version": 2}}, "unfinished"),
        (PASSED, 1, {"ops-rollout": {"model": "flight-delay", "challenger_version": 2,
                                     "state": {"status": "running"}}}, "unfinished"),
        # the champion changed since the gate: the verdict is about another model
        (PASSED, 2, {}, "judge again"),
        # a finished canary of another challenger, or a canary of another model, does not block
        (PASSED, 1, {"old": {"model": "flight-delay", "challenger_version": 2, "state": {"status": "promoted"}},
                     "other": {"model": "other-model", "challenger_version": 3}}, "start"),
    ],
)  # fmt: skip
def test_a_passing_challenger_starts_one_canary(gate, champion, canaries, expected):
    decision = start_canary(gate, "flight-delay", champion, canaries)
    if expected != "start":
        assert isinstance(decision, NoCanary) and expected in decision.reason, decision
        return
    assert isinstance(decision, StartCanary) and decision.name == "flight-delay.loop-v3"
    body = decision.body
    assert (body["champion_version"], body["challenger_version"], body["steps"]) == (1, 3, [0, 25, 100])
    assert body["shadow"]["min_clusters"] >= 5  # the shadow step first: judged paired over days, not one good day
    # the canary carries what led to it: the chain `keel ledger why` prints
    assert body["origin"]["drift_window"] == "2013-06" and body["origin"]["gate_month"] == "2013-06"
    assert (body["origin"]["drift_event"], body["origin"]["challenger_run"]) == (42, "run-9")
    validate_policy(decision.name, "canary", body)  # the policy store accepts it as it is


@pytest.mark.parametrize(
    "month, expected",
    [
        ("2013-01", None),
        ("2013-02", None),  # one month before it: nothing to early-stop on
        ("2013-03", (("2013-01",), "2013-02")),
        ("2013-05", (("2013-01", "2013-02", "2013-03"), "2013-04")),  # the challenger's recipe: four months
        ("2013-12", (("2013-08", "2013-09", "2013-10"), "2013-11")),
    ],
)
def test_the_naive_baseline_retrains_on_the_months_before(month, expected):
    assert naive_window(month) == expected


def test_what_served_when_is_the_latest_release_at_or_before_the_instant():
    t = lambda d, h=12: datetime(2013, 5, d, h, tzinfo=UTC)  # noqa: E731
    releases = [Release(t(1), "rel-a", "a"), Release(t(15, 3), "rel-b", "b"), Release(t(15, 3), "rel-c", "c")]
    assert champion_at(releases, t(1, 11)) is None  # before the first release nothing served
    assert champion_at(releases, t(1)).release_id == "rel-a"  # boundaries inclusive
    assert champion_at(releases, t(14)).release_id == "rel-a"
    assert champion_at(releases, t(15)).release_id == "rel-c"  # two entries at one instant: the later one


def test_a_canary_waits_as_long_as_its_labels_take_to_come_in():
    """A rate quote's price is known weeks after the quote: its use case's label delay lengthens the loop canary's
    progress deadline, so the canary is not rolled back for lack of labels it could not yet have."""
    gate = GateResult(True, 2, 1, "2016-11", "better")
    quick = start_canary(gate, "room-rate", 1, {})
    slow = start_canary(gate, "room-rate", 1, {}, label_delay_s=60 * 86400.0)
    assert slow.body["progress_deadline_s"] - quick.body["progress_deadline_s"] == 60 * 86400.0
    regression = start_canary(gate, "room-rate", 1, {}, loss="squared-error")
    from keel.canary_plan import CanaryPlan

    assert CanaryPlan.from_policy(regression.body).loss == "squared-error"  # how its quality verdicts name the loss
    from usecases.hotels import usecase as hotels

    assert hotels.loop.label_delay.days == 60


def test_the_expanding_reference_takes_every_month_before_and_a_promotion_its_delay():
    from keel.loop.report import Promotion, expanding_window

    months = tuple(f"2013-{m:02d}" for m in range(1, 13))
    assert expanding_window("2013-02", months) is None  # one month before: nothing to early-stop on
    assert expanding_window("2013-03", months) == (("2013-01",), "2013-02")
    assert expanding_window("2013-12", months) == (months[:10], "2013-11")  # January…October, stopped on November
    december = Promotion(datetime(2014, 1, 3, 12, tzinfo=UTC), "rel-9", 9, "2013-12")
    assert december.delay_days == 2.5  # the year's end to January 3rd noon
    assert Promotion(datetime(2013, 5, 1, tzinfo=UTC), "rel-1", 1, None).delay_days is None  # not the loop's


@pytest.mark.parametrize(
    ("built_key", "whole"),
    [
        ("landing:2013-06:30-30", True),  # the complete delivery's rebuild: judged on the whole month
        ("landing:2013-06:24-24", False),  # the last build read 24 days; the complete one is still queued
        (None, False),  # never built: a challenger would find no stored partition to gate on
        ("run:0c1f…", True),  # built by a backfill or a rebuild, not a delivery: it read every landed day
        ("manual-rebuild-2013-06", True),
    ],
)
def test_a_month_is_labelled_for_the_loop_only_once_its_features_are_built_from_all_it_landed(built_key, whole):
    from keel.loop.arrivals import Landed, built_whole

    assert built_whole("2013-06", Landed((30, 30)), built_key) is whole


def test_a_use_case_whose_labels_are_slow_starts_its_canary_serving_not_in_shadow():
    """Hotels (``Loop(shadow=False)``): a quote's price lands weeks later, so a shadow judged on its requests' labels
    would hold the better model back for weeks; its canary starts at 25 % (health, then the paired guard as labels
    land), its quality the gate's. Flights' begins in shadow."""
    from keel.canary_plan import CanaryPlan, CanaryState
    from usecases.flights import usecase as flights
    from usecases.hotels import usecase as hotels

    gate = GateResult(True, 2, 1, "2016-11", "better")
    assert flights.loop.shadow and not hotels.loop.shadow
    for uc, first in ((flights, 0.0), (hotels, 25.0)):
        decision = start_canary(gate, uc.model.name, 1, {}, shadow=uc.loop.shadow)
        plan = CanaryPlan.from_policy(decision.body)
        assert plan.steps[-1] == 100.0 and plan.paired  # the steps still score the champion's requests in shadow
        assert CanaryState().percent(plan) == first and plan.in_shadow(CanaryState()) is (first == 0.0), uc.name
        validate_policy(decision.name, "canary", decision.body, lambda m: [1, 2])  # the policy store accepts it


def test_a_canary_whose_quality_the_gate_judged_promotes_on_healthy_answers_before_their_labels():
    """Hotels' canary: 30 healthy answers at 25 % and 30 at 100 %, none labelled yet, and it is promoted — the
    gate judged its quality on realized labels. The same canary without ``gate_judged`` holds at 25 % until the
    steps' own requests have 200 labels in each arm (for a rate quote: weeks)."""
    from keel.canary import decide
    from keel.canary_plan import ArmStats, CanaryPlan, CanaryState

    gate = GateResult(True, 2, 1, "2016-11", "better")
    body = start_canary(gate, "room-rate", 1, {}, loss="squared-error", shadow=False).body
    healthy, champion = ArmStats(requests=30, errors=0), ArmStats(requests=90, errors=0)
    for judged, expected in ((True, ["advance", "promote"]), (False, ["hold"])):
        plan = CanaryPlan.from_policy({**body, "gate_judged": judged})  # paired, as the loop commits it
        state, actions, now = CanaryState(started_at=0.0, step_started_at=0.0, armed_at=0.0), [], 86400.0
        for _ in range(2):
            d = decide(plan, state, healthy, champion, now)
            actions.append(d.action)
            if d.action != "advance":
                break
            state, now = d.state, now + 86400.0
        assert actions == expected, (judged, d.reasons)
        if not judged:
            assert "quality not judged yet" in " ".join(d.reasons)
