"""A canary whose first step is the shadow (0 %): the challenger scores every request beside the champion, unserved,
and is judged paired on the same flights' realized labels before it serves — advanced when surely better, rolled
back when surely worse or never surely better within its limit. Real policy store, registry, exposure log."""

from __future__ import annotations

import json
import logging

import pytest

from keel.canary_control import tick
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from tests.policy.canary_world import CANARY, T0, january_outcomes, split

SHADOW_CANARY = CANARY | {"steps": [0, 100], "shadow": {"min_labelled": 200, "min_clusters": 5},
                          "shadow_max_s": 10 * 86400.0, "progress_deadline_s": 30 * 86400.0}  # fmt: skip


def shadowed_traffic(log, start, rows, champion_score, shadow_score, days: int = 6) -> None:
    """The champion answers every flight (v1), the challenger (v2) scores each in shadow; spread over ``days``."""
    from usecases.flights.features import FLIGHT

    for i, row in enumerate(rows):
        key = FLIGHT.key.of({**row, "time_hour": row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ")})
        log.append({"ts": start + (i % days) * 86400 + i * 0.01, "model": "flight-delay", "routed_version": 1,
                    "model_version": 1, "status": 200, "latency_ms": 4.0, "score": champion_score(row),
                    "shadow_version": 2, "shadow_score": shadow_score(row), "entity_key": key})  # fmt: skip


@pytest.mark.parametrize(
    ("shadow_quality", "action", "percent", "reason"),
    [
        ("better", "advance", 100.0, "better in shadow"),  # surely better on the same flights: served next
        ("worse", "rollback", 0.0, "surely worse in shadow"),  # never served a single request
    ],
)
def test_a_shadow_canary_is_judged_paired_before_it_serves(
    world,
    tmp_path,
    validated,  # noqa: F811 - the shared session fixture
    shadow_quality,
    action,
    percent,
    reason,
):
    store, registry, log, exposures, shas = world
    storage, flights = january_outcomes(tmp_path, validated)
    store.apply({"rollout": ("canary", SHADOW_CANARY)}, author="ops", reason="shadow first")
    [start] = tick(store, registry, exposures, T0, storage_dir=storage)
    body = store.state()["rollout.split"].body
    assert start["percent"] == 0.0 and split(store) == {"champion": 1.0, "challenger": 0.0} and body["shadow"] == 2
    base = float((flights["arr_delay"] > 15).mean())

    def informed(row):  # knows a little about each flight's outcome
        return min(0.95, max(0.05, base + (0.15 if row["arr_delay"] > 15 else -0.05)))

    champion, shadow = (lambda r: base, informed) if shadow_quality == "better" else (informed, lambda r: base)
    rows = flights.head(1200).to_dicts()
    shadowed_traffic(log, T0 + 1, rows[:600], champion, shadow, days=1)  # one day: one observation, not 600
    assert tick(store, registry, exposures, T0 + 2, storage_dir=storage) == []  # holds: 1 day of 5
    shadowed_traffic(log, T0 + 2, rows[600:], champion, shadow)
    [decision] = tick(store, registry, exposures, T0 + 7 * 86400, storage_dir=storage)
    assert (decision["action"], decision["percent"]) == (action, percent)
    assert reason in decision["reasons"][0]
    evidence = json.loads(store.commit(decision["version"]).reason)["evidence"]["shadow"]
    assert evidence["labelled"] == 1200 and evidence["clusters"] >= 5 and evidence["loss"] == "log_loss"
    assert "shadow" not in store.state()["rollout.split"].body  # a served step (or none): no shadow scoring


def test_a_shadow_that_is_never_surely_better_is_rolled_back_at_its_deadline(world, tmp_path, validated):  # noqa: F811
    store, registry, log, exposures, shas = world
    storage, flights = january_outcomes(tmp_path, validated)
    store.apply({"rollout": ("canary", SHADOW_CANARY)}, author="ops", reason="shadow first")
    tick(store, registry, exposures, T0, storage_dir=storage)
    base = float((flights["arr_delay"] > 15).mean())
    shadowed_traffic(log, T0 + 1, flights.head(900).to_dicts(), lambda r: base, lambda r: base)  # the same answers
    assert tick(store, registry, exposures, T0 + 9 * 86400, storage_dir=storage) == []  # holding, in shadow
    [late] = tick(store, registry, exposures, T0 + 11 * 86400, storage_dir=storage)
    assert late["action"] == "rollback" and "not better in shadow within 10 days" in late["reasons"][0]


def test_a_shadow_rolled_back_for_lack_of_labels_says_where_they_went(world, tmp_path, validated):  # noqa: F811
    """The challenger scored every request in shadow, but none of those flights' outcomes was ever built: the
    rollback's reason says so — requests scored by both, none labelled, and why — not just "0 labelled rows"."""
    store, registry, log, exposures, shas = world
    storage, _ = january_outcomes(tmp_path, validated)
    store.apply({"rollout": ("canary", SHADOW_CANARY)}, author="ops", reason="shadow first")
    tick(store, registry, exposures, T0, storage_dir=storage)
    for i in range(300):  # flights of a day whose outcomes are not in storage
        log.append({"ts": T0 + 1 + (i % 6) * 86400 + i * 0.01, "model": "flight-delay", "routed_version": 1,
                    "model_version": 1, "status": 200, "latency_ms": 4.0, "score": 0.2, "shadow_version": 2,
                    "shadow_score": 0.3, "entity_key": f"2099-01-01|XX|{i}|JFK"})  # fmt: skip
    [late] = tick(store, registry, exposures, T0 + 21 * 86400, storage_dir=storage)
    assert late["action"] == "rollback", late
    assert "300 requests scored by both, 0 of them with a realized label" in late["reasons"][0]
    assert "outcomes are not built yet" in late["reasons"][0]


def a_shadow_of_the_same_answers(world, tmp_path, validated):  # noqa: F811
    """A shadow canary started at T0 whose challenger scored 900 January flights the same as the champion; returns
    where their outcomes are stored."""
    store, registry, log, exposures, _ = world
    storage, flights = january_outcomes(tmp_path, validated)
    store.apply({"rollout": ("canary", SHADOW_CANARY)}, author="ops", reason="shadow first")
    tick(store, registry, exposures, T0, storage_dir=storage)
    base = float((flights["arr_delay"] > 15).mean())
    shadowed_traffic(log, T0 + 1, flights.head(900).to_dicts(), lambda r: base, lambda r: base)
    return storage


def test_a_bug_in_the_evidence_code_is_no_decision_and_is_logged_with_its_traceback(
    world,
    tmp_path,
    validated,  # noqa: F811 - the shared session fixture
    monkeypatch,
    caplog,
):
    """Issue 61 item 5: a bug while reading the evidence (here a KeyError raised where labels are read) was caught as
    "no data", and at the shadow's deadline the challenger was rolled back as lacking labels. Now the bug makes no
    decision: the canary holds where it was, the tick's problems name the error, the log holds its traceback."""
    store, registry, _, exposures, _ = world
    storage = a_shadow_of_the_same_answers(world, tmp_path, validated)
    before = store.state()["rollout"].body["state"]

    def broken(*args, **kwargs):
        raise KeyError("label_late15")  # a bug, not missing data

    monkeypatch.setattr("keel.canary_control.realized_labels", broken)
    problems: list[str] = []
    with caplog.at_level(logging.WARNING, logger="keel.canary_control"):
        assert tick(store, registry, exposures, T0 + 11 * 86400, storage_dir=storage, problems=problems) == []
    assert store.state()["rollout"].body["state"] == before  # not rolled back, not advanced
    assert problems == ["canary 'rollout' skipped, no decision made: KeyError: 'label_late15'"]
    [record] = [r for r in caplog.records if "skipped this tick" in r.getMessage()]
    assert record.exc_info and record.exc_info[0] is KeyError


def test_evidence_that_cannot_be_read_is_named_in_the_decisions_reason(
    world,
    tmp_path,
    validated,  # noqa: F811 - the shared session fixture
    monkeypatch,
    caplog,
):
    """Labels that cannot be read (a file gone, OSError) are missing evidence: the decision at the deadline says which
    error, beside its reason, and the log holds the traceback."""
    store, registry, _, exposures, _ = world
    storage = a_shadow_of_the_same_answers(world, tmp_path, validated)

    def gone(*args, **kwargs):
        raise FileNotFoundError("storage/flights/validated_flights/2013-01.parquet")

    monkeypatch.setattr("keel.canary_control.realized_labels", gone)
    problems: list[str] = []
    with caplog.at_level(logging.WARNING, logger="keel.canary_control"):
        [late] = tick(store, registry, exposures, T0 + 21 * 86400, storage_dir=storage, problems=problems)
    assert late["action"] == "rollback"
    named = "the shadow's exposure log or labels could not be read: FileNotFoundError: storage/flights/validated_fl"
    assert any(r.startswith(named) for r in late["reasons"]), late["reasons"]
    assert any(p.startswith(named) for p in problems)
    reason = json.loads(store.commit(late["version"]).reason)["reasons"]
    assert any(r.startswith(named) for r in reason)
    assert any(r.exc_info and r.exc_info[0] is FileNotFoundError for r in caplog.records)
