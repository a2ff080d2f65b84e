"""The committee candidate (keel/loop/committee.py): one LightGBM text model whose raw score and TreeSHAP
contributions are the weighted mean of its members', and which refuses members that do not read the same features;
and the candidate list a drift decision trains (keel/loop/candidates.py)."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest

from keel.loop.candidates import candidate_specs
from keel.loop.committee import committee_model_text

RNG = np.random.default_rng(7)
X = RNG.normal(size=(2_000, 4))
Y = (X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + RNG.normal(scale=0.5, size=2_000) > 0).astype(float)


def fit(rows: slice, objective: str = "binary", seed: int = 0, names=("a", "b", "c", "d")) -> str:
    target = Y[rows] if objective == "binary" else X[rows, 0] * 3 + X[rows, 1]
    data = lgb.Dataset(X[rows], target, feature_name=list(names))
    params = {"objective": objective, "verbose": -1, "num_leaves": 7, "seed": seed, "deterministic": True}
    return lgb.train(params, data, num_boost_round=20 + seed).model_to_string()


@pytest.mark.parametrize("objective", ["binary", "regression"])
@pytest.mark.parametrize("weights", [None, [0.2, 0.3, 0.5]])
def test_the_committee_scores_and_explains_as_the_weighted_mean_of_its_members(objective, weights):
    texts = [
        fit(slice(0, 800), objective),
        fit(slice(600, 1_400), objective, 1),
        fit(slice(1_000, 2_000), objective, 2),
    ]
    w = weights or [1 / 3] * 3
    boosters = [lgb.Booster(model_str=t) for t in texts]
    committee = lgb.Booster(model_str=committee_model_text(texts, weights))
    assert committee.num_trees() == sum(b.num_trees() for b in boosters)
    raw = committee.predict(X, raw_score=True)
    assert raw == pytest.approx(
        sum(wi * b.predict(X, raw_score=True) for wi, b in zip(w, boosters, strict=False)), abs=1e-9
    )
    contrib = committee.predict(X[:200], pred_contrib=True)
    assert contrib.sum(axis=1) == pytest.approx(raw[:200], abs=1e-9)  # contributions still add up to the raw score
    if objective == "binary":  # the probability is the sigmoid of the mean raw score, not the mean probability
        assert committee.predict(X) == pytest.approx(1 / (1 + np.exp(-raw)), abs=1e-12)


@pytest.mark.parametrize(
    "texts, weights, message",
    [
        (lambda: [fit(slice(0, 500))], None, "at least two members"),
        (lambda: [fit(slice(0, 500)), fit(slice(0, 500), names=("a", "b", "c", "e"))], None, "feature_names differs"),
        (lambda: [fit(slice(0, 500)), fit(slice(0, 500), "regression")], None, "objective differs"),
        (lambda: [fit(slice(0, 500)), fit(slice(500, 900))], [1.0, -0.5], "finite positive"),
        (lambda: [fit(slice(0, 500)), fit(slice(500, 900))], [1.0], "one finite positive number per member"),
        (lambda: [fit(slice(0, 500)), "not a model"], None, "not a LightGBM text model"),
    ],
)
def test_a_committee_of_mismatched_members_is_refused_and_says_which(texts, weights, message):
    with pytest.raises(ValueError, match=message):
        committee_model_text(texts(), weights)


@pytest.mark.parametrize(
    "rolling, label_drift, expected",
    [
        # the first decision: the rolling window is all the history there is — it is the refit the committee keeps
        (("2013-01", "2013-02"), False, [("rolling", True), ("recency", False), ("committee", False)]),
        (("2013-02", "2013-03", "2013-04"), False,
         [("rolling", False), ("expanding", True), ("recency", False), ("committee", False)]),
        (("2013-02", "2013-03", "2013-04"), True,
         [("rolling", False), ("expanding", True), ("recency", False), ("committee", False), ("recalibrated", False)]),
    ],
)  # fmt: skip
def test_a_drift_decision_trains_the_committee_after_the_refit_it_averages(rolling, label_drift, expected):
    period = tuple(f"2013-{m:02d}" for m in range(1, 13))
    specs = candidate_specs(rolling, period, label_drift)
    assert [(s.name, s.expanding) for s in specs] == expected
    committee = next(s for s in specs if s.committee)
    assert committee.train_months == period[: period.index(rolling[-1]) + 1]  # it averages the expanding refit
    assert "first model" in committee.describe()


@pytest.mark.parametrize(
    "rolling, label_drift, expected",
    [
        # hotels' recipes: no window of recent months only — the expanding refit, the committee, a recalibration
        (("2016-08", "2016-09", "2016-10"), True, [("expanding", True), ("committee", False), ("recalibrated", False)]),
        (("2016-08", "2016-09", "2016-10"), False, [("expanding", True), ("committee", False)]),
        # when the rolling window is all the history there is, the expanding candidate is fitted on it
        (("2016-07", "2016-08"), False, [("expanding", True), ("committee", False)]),
    ],
)  # fmt: skip
def test_a_use_case_trains_only_the_recipes_it_lists(rolling, label_drift, expected):
    period = ("2016-07", "2016-08", "2016-09", "2016-10", "2016-11")
    specs = candidate_specs(rolling, period, label_drift, ("expanding", "committee", "recalibrated"))
    assert [(s.name, s.expanding) for s in specs] == expected
    assert next(s for s in specs if s.expanding).train_months == period[: period.index(rolling[-1]) + 1]


@pytest.mark.parametrize(
    "candidates, message",
    [
        (("rolling", "bagging"), r"\['bagging'\]"),
        ((), "must be one of"),
        (("rolling", "committee"), "list 'expanding' with it"),
    ],
)
def test_a_loop_listing_an_unknown_or_incomplete_recipe_is_refused_by_name(candidates, message):
    from keel.usecase import Loop, UseCaseError

    with pytest.raises(UseCaseError, match=message):
        Loop(candidates=candidates)


@pytest.mark.parametrize("rounds", [0, 201])
def test_a_loop_whose_early_stopping_cannot_happen_is_refused(rounds):
    from keel.usecase import Loop, UseCaseError

    with pytest.raises(UseCaseError, match=f"early_stopping_rounds must be 1…200.*got {rounds}"):
        Loop(early_stopping_rounds=rounds)


def test_a_regression_use_case_may_also_fit_the_expanding_window_to_the_median():
    period = ("2016-07", "2016-08", "2016-09", "2016-10", "2016-11")
    specs = candidate_specs(("2016-08", "2016-09", "2016-10"), period, False, ("expanding", "robust"))
    assert [(s.name, s.expanding, s.objective) for s in specs] == [
        ("expanding", True, None),
        ("robust", False, "regression_l1"),  # not the committee's member: that stays the squared-error refit
    ]
    assert specs[1].train_months == specs[0].train_months == period[:4]
    assert "to the median" in specs[1].describe()
    assert "robust" not in [s.name for s in candidate_specs(("2016-08",), period, True)]  # listed, not by default


def test_a_binary_use_case_listing_the_median_fit_is_refused_by_name():
    import dataclasses

    from keel.usecase import UseCaseError
    from usecases.flights import usecase as flights

    with pytest.raises(UseCaseError, match=r"use case flights: loop candidate 'robust' fits the median.*is binary"):
        dataclasses.replace(flights, loop=dataclasses.replace(flights.loop, candidates=("expanding", "robust")))
