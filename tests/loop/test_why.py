"""``keel why`` as the loop's story (keel/loop/why.py): the links from a drift report through the challenger's
training, its gate and canary to the release it became — and a recalibration and the gate's choice among candidates
named as such."""

from __future__ import annotations

from keel.loop.why import explain, from_loop


def test_why_links_drift_training_gate_canary_and_release():
    meta = {
        "trigger": {"drift_window": "2013-06", "drift_event": 41},
        "run_id": "run-9",
        "train_months": ["2013-03", "2013-04"],
        "valid_month": "2013-05",
        "challenger_gate": {"passed": True, "gate_month": "2013-06", "champion_version": 1, "reason": "better by 0.01",
                            "run_id": "run-9"},
    }  # fmt: skip
    commits = [
        (5, "2026-12-01T01:00:00+00:00", "loop", "challenger v3 passed its gate on 2013-06; canary started"),
        (6, "2026-12-01T01:00:01+00:00", "canary-controller", '{"action": "start", "percent": 1.0, "reasons": ["rollout started"]}'),
        (9, "2026-12-01T01:03:00+00:00", "canary-controller", '{"action": "promote", "percent": 100.0, "reasons": ["all 5 steps passed"]}'),
    ]  # fmt: skip
    chain = explain("rel-abc", "2013-07-20T10:00:00+00:00", 3, meta, commits)
    assert [link.step for link in chain] == [
        "drift report", "training run", "gate", "policy v5", "policy v6", "policy v9", "ledger",
    ]  # fmt: skip
    assert "drift_report[2013-06], event 41" in chain[0].detail
    assert "fitted on 2013-03, 2013-04, early-stopped on 2013-05" in chain[1].detail
    assert chain[2].detail.startswith("passed on 2013-06 against v1")
    assert "promote at 100.0 %: all 5 steps passed" in chain[5].detail
    assert chain[-1].when == "2013-07-20T10:00:00+00:00" and "serving v3" in chain[-1].detail
    assert from_loop(meta) and not from_loop({"train_months": ["2013-01"]})
    # the first model: no drift, no gate, no canary — only its release
    assert [link.step for link in explain("rel-1", "2013-04-01T12:00:00+00:00", 1, {}, [])] == ["ledger"]


def test_why_names_a_recalibration_and_the_candidate_choice():
    meta = {
        "trigger": {"drift_window": "2013-12", "drift_event": 77}, "run_id": "run-12", "candidate": "recalibrated",
        "train_months": ["2013-08", "2013-09", "2013-10"], "valid_month": "2013-11",
        "recalibration": {"of_version": 6, "fitted_on": "2013-12 days 1–21", "describe": "platt on 4,000 rows: raw × "
                          "0.9500 +0.4000; loss 0.6100 → 0.5800"},
        "challenger_gate": {"candidate": "recalibrated", "chosen": True, "surely_better": True, "gate_month": "2013-12",
                            "champion_version": 6, "reason": "log-loss better by 0.0200", "run_id": "run-13"},
    }  # fmt: skip
    chain = explain("rel-x", "2014-01-03T12:00:00+00:00", 9, meta, [])
    assert "v9 is v6 recalibrated on 2013-12 days 1–21 (platt on 4,000 rows" in chain[1].detail
    assert chain[2].detail.startswith("chosen among the candidates on 2013-12 against v6")
    weighted = meta | {"candidate": "recency", "half_life_days": 60.0, "recalibration": None}
    assert "with recency weights (half-life 60 days)" in explain("r", "t", 8, weighted, [])[1].detail
    committee = meta | {"candidate": "committee", "recalibration": None, "committee": [
        {"role": "first model", "version": 1}, {"role": "previous expanding refit", "version": 4},
        {"role": "this decision's expanding refit", "version": 7}]}  # fmt: skip
    assert (
        "v9 is the mean of v1 (first model), v4 (previous expanding refit), v7 (this decision's expanding refit)"
        in explain("r", "t", 9, committee, [])[1].detail
    )


def test_why_names_the_estimate_that_stopped_or_went_with_a_canary_step():
    """Each canary decision's evidence carries both arms' estimated quality (keel/canary_control.py): the chain says
    what it was beside the decision."""
    import json

    worse = {"metric": "log_loss", "challenger": 0.62, "champion": 0.5, "worse": True, "not_worse": False}
    better = {**worse, "challenger": 0.49, "worse": False, "not_worse": True}
    rollback = {"action": "rollback", "reasons": ["estimated log_loss surely worse"], "evidence": {"estimate": worse}}
    advance = {"action": "advance", "reasons": ["better in shadow"], "evidence": {"estimate": better}}
    commits = [
        (7, "t", "canary-controller", json.dumps(advance)),
        (8, "t", "canary-controller", json.dumps(rollback)),
    ]
    chain = explain("rel-x", "2013-07-20T10:00:00+00:00", 3, {}, commits)
    assert "[estimate before the labels: log_loss 0.4900 vs the champion's 0.5000, not worse]" in chain[0].detail
    assert "log_loss 0.6200 vs the champion's 0.5000, surely worse]" in chain[1].detail
