"""Table tests of the shadow verdict (keel/loop/shadow.py) and the choice among candidates (keel/loop/candidates.py):
paired per-row loss differences, judged with a variance that respects clustering by day, and Holm's correction when
several candidates are compared with the champion."""

from __future__ import annotations

import numpy as np
import pytest

from keel.loop.candidates import choose_candidate, holm
from keel.loop.shadow import ShadowPolicy, clustered_mean_se, shadow_verdict
from keel.metrics import per_row_loss


def days_of_rows(days: int, per_day: int) -> np.ndarray:
    return np.repeat(np.arange(days), per_day)


def binary_world(days: int, per_day: int, seed: int = 0):
    """Labels from a known probability p; a champion that says p."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.6, days * per_day)
    y = (rng.uniform(size=p.size) < p).astype(float)
    return y, p, days_of_rows(days, per_day)


def test_the_clustered_standard_error_counts_a_day_that_moves_together_as_one():
    """A difference that is one value per day (the whole day moves together): 30 days × 100 rows are 30
    observations, not 3,000 — the clustered SE is that of 30 day means; the i.i.d. SE would be 10× smaller."""
    rng = np.random.default_rng(1)
    per_day = rng.normal(0, 1, 30)
    d = np.repeat(per_day, 100)
    mean, se, g = clustered_mean_se(d, days_of_rows(30, 100))
    assert g == 30 and mean == pytest.approx(per_day.mean())
    assert se == pytest.approx(per_day.std(ddof=1) / np.sqrt(30), rel=1e-9)
    iid = d.std(ddof=1) / np.sqrt(d.size)
    assert se > 5 * iid


@pytest.mark.parametrize(
    ("case", "better", "reason"),
    [
        ("a clearly better challenger", True, "better by"),
        ("the same model", False, "differs by exactly 0.0000"),
        ("a worse challenger", False, "not better: worse by"),
        ("too few labels", False, "fewer than 200 to judge on"),
        ("one day of labels", False, "1 days (clusters) of labels: fewer than 5"),
        ("better only on shocks shared within days", False, "but not surely"),
    ],
)
def test_the_shadow_verdict(case, better, reason):
    y, p, days = binary_world(20, 150)
    champion, challenger, clusters, labels = np.clip(p + 0.15, 0, 0.99), p, days, y  # the champion is miscalibrated
    if case == "the same model":
        challenger = champion
    elif case == "a worse challenger":
        champion, challenger = challenger, champion
    elif case == "too few labels":
        labels, champion, challenger, clusters = y[:150], champion[:150], challenger[:150], days[:150]
    elif case == "one day of labels":
        labels, champion, challenger, clusters = y[:300], champion[:300], challenger[:300], np.zeros(300)
    elif case == "better only on shocks shared within days":
        # a little better on average, with a day-wide swing each day: as 3,000 i.i.d. rows that would be evidence
        # (bound below 0), as 20 days it is not
        labels, champion, challenger = with_loss_differences(per_day_differences(20, -0.005, 0.02), days)
        d = np.log(1 - champion) - np.log(1 - challenger)
        assert d.mean() + 1.645 * d.std(ddof=1) / np.sqrt(d.size) < 0  # what an i.i.d. test would have said
    v = shadow_verdict(labels, champion, challenger, clusters, ShadowPolicy())
    assert v.better is better and reason in v.reason, v


def per_day_differences(days: int, mean: float, sd: float) -> np.ndarray:
    """``days`` values with exactly this mean and sample standard deviation."""
    z = np.random.default_rng(days).normal(size=days)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


def with_loss_differences(per_day: np.ndarray, days: np.ndarray):
    """(labels, champion, challenger) whose per-row log-loss difference is exactly the row's day's value: every label
    0 and the champion saying 0.2, so the challenger's score is the one whose loss −log(1 − s) differs by it."""
    champion = np.full(days.size, 0.2)
    challenger = 1 - np.exp(-(-np.log(1 - champion) + per_day[days]))
    return np.zeros(days.size), champion, challenger


def test_a_worse_challenger_that_looks_better_on_its_first_day_is_not_promoted():
    """Day 0 favours the challenger (the champion is off that day), every later day the champion is better: judged on
    day 0 alone there is one cluster — too few; judged on the whole shadow period it is worse."""
    y, p, days = binary_world(20, 200, seed=3)
    champion = np.where(days == 0, np.clip(p + 0.25, 0, 0.99), p)
    challenger = np.clip(p + 0.1, 0, 0.99)
    first = days == 0
    early = shadow_verdict(y[first], champion[first], challenger[first], days[first])
    looks = np.mean(
        per_row_loss("binary", challenger[first], y[first]) - per_row_loss("binary", champion[first], y[first])
    )
    assert looks < 0 and not early.better and "fewer than 5" in early.reason  # it looks better: not judged on it
    later = shadow_verdict(y, champion, challenger, days)
    assert not later.better and later.delta > 0, later


def test_a_regression_challenger_is_judged_on_squared_error():
    rng = np.random.default_rng(2)
    price = rng.uniform(50, 250, 3000)
    days = days_of_rows(30, 100)
    v = shadow_verdict(
        price, price + rng.normal(0, 30, 3000), price + rng.normal(0, 10, 3000), days, task="regression"
    )
    assert v.better and v.loss == "squared_error" and v.delta < -500, v


def test_holm_holds_the_smallest_p_value_to_alpha_over_k_and_stops_at_the_first_accepted():
    levels = holm({"a": 0.001, "b": 0.02, "c": 0.03, "d": None}, 0.05)
    assert levels["a"] == (pytest.approx(0.05 / 3), True)
    assert levels["b"] == (pytest.approx(0.05 / 2), True)
    assert levels["c"] == (pytest.approx(0.05), True)
    assert levels["d"] == (None, False)
    stopped = holm({"a": 0.02, "b": 0.021, "c": 0.001}, 0.05)  # 0.001 ≤ 0.0167; 0.02 ≤ 0.025; 0.021 > 0.05/1? no
    assert [stopped[k][1] for k in ("c", "a", "b")] == [True, True, True]
    blocked = holm({"a": 0.03, "b": 0.04}, 0.05)  # 0.03 > 0.025: nothing after it is rejected either
    assert blocked == {"a": (pytest.approx(0.025), False), "b": (None, False)}


def test_the_choice_takes_the_best_surely_better_candidate_and_corrects_for_their_number():
    y, p, days = binary_world(30, 150, seed=7)
    champion = np.clip(p + 0.12, 0, 0.99)
    candidates = {
        "rolling": np.clip(p + 0.06, 0, 0.99),  # better
        "expanding": p,  # best
        "recency": np.clip(p + 0.2, 0, 0.99),  # worse
    }
    choice = choose_candidate(y, champion, candidates, days)
    assert choice.chosen == "expanding", choice.reason
    rows = {r.name: r for r in choice.rows}
    assert rows["expanding"].chosen and rows["rolling"].surely_better and not rows["rolling"].chosen
    assert not rows["recency"].surely_better
    table = [r.as_row() for r in choice.rows]
    assert {t["candidate"] for t in table} == set(candidates) and all("p_value" in t for t in table)


def test_a_surely_better_committee_is_preferred_over_a_lower_difference_but_not_over_holm():
    y, p, days = binary_world(30, 150, seed=7)
    champion = np.clip(p + 0.12, 0, 0.99)
    candidates = {"expanding": p, "committee": np.clip(p + 0.06, 0, 0.99)}  # both better, expanding the most
    choice = choose_candidate(y, champion, candidates, days)
    assert choice.chosen == "committee" and "preferred when surely better" in choice.reason, choice.reason
    rows = {r.name: r for r in choice.rows}
    assert rows["expanding"].verdict.delta < rows["committee"].verdict.delta  # not the lowest difference
    assert choose_candidate(y, champion, candidates, days, prefer=()).chosen == "expanding"
    # a committee that is not surely better is not preferred: the surely-better one with the lowest difference is
    worse = {"expanding": p, "committee": np.clip(p + 0.2, 0, 0.99)}
    assert choose_candidate(y, champion, worse, days).chosen == "expanding"


def test_a_candidate_that_passes_alone_can_fail_among_many():
    """One candidate whose one-sided p-value is between α/k and α: alone it is surely better; among k = 4
    candidates (the others no better) Holm holds it to α/4 and the champion stays."""
    days = days_of_rows(40, 50)
    # 40 day differences of mean −0.0035 and sd 0.01165: t = 1.9 on 39 degrees of freedom, one-sided p ≈ 0.032
    y, champion, challenger = with_loss_differences(per_day_differences(40, -0.0035, 0.01165), days)
    alone = choose_candidate(y, champion, {"one": challenger}, days)
    p_value = alone.rows[0].verdict.p_value
    assert 0.05 / 4 < p_value < 0.05, p_value
    assert alone.chosen == "one"
    same = {f"no-better-{i}": champion.copy() for i in range(3)}
    among = choose_candidate(y, champion, {"one": challenger, **same}, days)
    assert among.chosen is None and "Holm" in among.reason, among.reason
