"""The drift decision as a value: table tests of keel.drift.policy.decide."""

from __future__ import annotations

import pytest

from keel.drift.policy import DriftPolicy, decide
from tests.drift.summaries import feat


@pytest.mark.parametrize(
    "features, frozen, policy, freeze, unfreeze, retrain",
    [
        ({"a": feat(False)}, set(), DriftPolicy(), [], [], False),
        ({"a": feat(True, "warn", 0.2)}, set(), DriftPolicy(), [], [], True),
        ({"a": feat(True, "error", 0.9)}, set(), DriftPolicy(), ["a"], [], True),
        ({"a": feat(True, "error", 0.9)}, {"a"}, DriftPolicy(), [], [], True),  # already frozen: not again
        ({"a": feat(False)}, {"a"}, DriftPolicy(), [], ["a"], False),  # clear again: unfreeze
        ({"a": feat(False)}, {"a"}, DriftPolicy(unfreeze_when_clear=False), [], [], False),
        ({"a": feat(None)}, {"a"}, DriftPolicy(), [], [], False),  # no data says nothing: stays frozen
        ({"a": feat(True, "warn", 0.2)}, set(), DriftPolicy(freeze_at="warn", retrain_at="none"), ["a"], [], False),
        (
            {"a": feat(True, "error", 0.9), "b": feat(True, "warn", 0.2)},
            set(),
            DriftPolicy(retrain_at="error"),
            ["a"],
            [],
            True,
        ),
        ({"b": feat(True, "warn", 0.2)}, set(), DriftPolicy(retrain_at="error"), [], [], False),
    ],
)
def test_decide(features, frozen, policy, freeze, unfreeze, retrain):
    d = decide("2013-12", features, policy, frozen)
    assert [f.feature for f in d.freeze] == freeze
    assert list(d.unfreeze) == unfreeze
    assert d.retrain is retrain
    if freeze:
        assert d.freeze[0].value == 1.0 and "2013-12" in d.freeze[0].reason
    if retrain:
        assert "2013-12" in d.retrain_reason
