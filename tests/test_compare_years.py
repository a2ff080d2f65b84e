"""scripts/compare_years.py (issue 46 item 9): every home's loop_report month by month, its promotions and its
traffic are compared — each planted difference is named, and identical years agree."""

from __future__ import annotations

import sys
from copy import deepcopy
from datetime import date

from tests import REPO

sys.path.insert(0, str(REPO / "scripts"))
import compare_years  # noqa: E402
from compare_years import Year  # noqa: E402


def year() -> Year:
    return Year(
        promotions={"flights/delay_model": [(date(2013, 6, 3), "a" * 64), (date(2013, 9, 2), "b" * 64)]},
        reports={
            "flights": {
                "2013-05": {"served_auc": 0.7012, "static_auc": 0.69},
                "2013-06": {"served_auc": 0.7104, "static_auc": 0.6801},
            }
        },  # fmt: skip
        traffic={"flights": {"sent": 48125, "ok": 48125, "failed": 0}},
    )


def test_identical_years_agree():
    assert compare_years.compare({"A": year(), "B": year(), "C": year()}, day_tolerance=1) == []


def test_every_planted_difference_is_named_in_any_home_not_only_against_the_firsts_keys():
    b, c = year(), year()
    b.promotions["flights/delay_model"][1] = (date(2013, 9, 5), "b" * 64)  # three days later
    b.reports["flights"]["2013-06"]["served_auc"] = 0.7204  # a month's value, beyond 3 decimals
    c.reports["flights"]["2013-06"]["naive_auc"] = 0.64  # a row only the third home reports
    del c.reports["flights"]["2013-05"]  # a month the third home lacks
    c.traffic["flights"] = {"sent": 48125, "ok": 48120, "failed": 5}
    problems = compare_years.compare({"A": year(), "B": b, "C": c}, day_tolerance=1)
    assert len(problems) == 5, problems
    assert any("bbbbbbbbbb live on 2013-09-05" in p for p in problems)
    assert any("2013-06 served_auc" in p and "B 0.72" in p for p in problems)
    assert any("2013-06 naive_auc" in p for p in problems)
    assert any("C: flights: no loop_report for 2013-05" in p for p in problems)
    assert any("C: flights traffic" in p for p in problems)


def test_within_the_tolerances_years_agree():
    b = deepcopy(year())
    b.promotions["flights/delay_model"][0] = (date(2013, 6, 4), "a" * 64)  # one day: within ± 1
    b.reports["flights"]["2013-05"]["served_auc"] = 0.70121  # the same to 3 decimals
    assert compare_years.compare({"A": year(), "B": b}, day_tolerance=1) == []


def decided() -> Year:
    """A year with issue 62's shape: flights' span April (the first model's month, outside the span) … June."""
    y = year()
    y.reports["flights"] = {
        "2013-04": {"served_auc": 0.5, "expanding_auc": 0.9, "served_log_loss": 0.9, "expanding_log_loss": 0.1},
        "2013-05": {"served_auc": 0.70, "static_auc": 0.68, "naive_auc": 0.69, "expanding_auc": 0.69}
        | {"served_log_loss": 0.505, "static_log_loss": 0.51, "naive_log_loss": 0.52, "expanding_log_loss": 0.504},
        "2013-06": {"served_auc": 0.72, "static_auc": 0.69, "naive_auc": 0.70, "expanding_auc": 0.72}
        | {"served_log_loss": 0.500, "static_log_loss": 0.51, "naive_log_loss": 0.52, "expanding_log_loss": 0.500},
    }
    y.decisions["flights"] = [
        compare_years.Decision(date(2013, 6, 3), "rollback", "delay_model.loop-v4", 3.0),
        compare_years.Decision(date(2013, 6, 17), "promote", "delay_model.loop-v5", 17.0),
    ]
    return y


def test_an_idle_and_a_busy_year_agree_on_decisions_within_three_days_and_differ_beyond():
    busy = decided()
    busy.decisions["flights"][1] = compare_years.Decision(date(2013, 6, 20), "promote", "delay_model.loop-v5", 20.0)
    assert compare_years.compare_decisions({"idle": decided(), "busy": busy}, day_tolerance=3) == []
    later = decided()
    later.decisions["flights"][0] = compare_years.Decision(date(2013, 6, 7), "rollback", "delay_model.loop-v4", 7.0)
    problems = compare_years.compare_decisions({"idle": decided(), "busy": later}, day_tolerance=3)
    assert problems == ["busy: flights: rollback delay_model.loop-v4 on 2013-06-07, in idle on 2013-06-03"]
    other = decided()
    other.decisions["flights"][0] = compare_years.Decision(date(2013, 6, 3), "promote", "delay_model.loop-v4", 3.0)
    problems = compare_years.compare_decisions({"idle": decided(), "busy": other}, day_tolerance=3)
    assert problems == ["busy: flights: other canaries promoted or rolled back than in idle"]


def test_the_bar_is_the_span_after_the_first_served_month_against_each_baseline():
    assert compare_years.bar(decided()) == []  # April (every policy's first model) is outside the span
    worse = decided()
    worse.reports["flights"]["2013-06"]["served_auc"] = 0.70  # mean 0.70 against the reference's 0.705
    worse.reports["flights"]["2013-05"]["served_log_loss"] = 0.510  # mean 0.505 against 0.502: beyond 0.002
    assert compare_years.bar(worse) == [  # still better than static and naive: only the reference is named
        "flights: served auc 0.7000 worse than the expanding reference's 0.7050",
        "flights: served log_loss 0.5050 worse than the expanding reference's 0.5020",
    ]
    within = decided()
    within.reports["flights"]["2013-05"]["served_log_loss"] = 0.507  # mean 0.5035: within 0.002 of 0.502
    assert compare_years.bar(within) == []
    behind_naive = decided()
    behind_naive.reports["flights"]["2013-06"]["naive_auc"] = 0.75
    assert compare_years.bar(behind_naive) == ["flights: served auc 0.7100 not better than naive's 0.7200"]
    slow = decided()
    slow.decisions["flights"][1] = compare_years.Decision(date(2013, 6, 25), "promote", "delay_model.loop-v5", 25.0)
    assert compare_years.bar(slow) == [
        "flights: delay_model.loop-v5 promoted 25 days after its gate month (at most 20)"
    ]


def test_decisions_are_read_from_the_reports_actions_once_each_and_only_when_they_ran():
    import dagster as dg

    def actions(*rows):
        return {"actions": dg.MetadataValue.table([dg.TableRecord(r) for r in rows])}

    promote = {"simulated": "2013-06-17T12:00:00+00:00", "action": "canary promote", "status": "SUCCESS"}
    promote |= {"detail": "delay_model.loop-v5: promote at 100 %", "days_after_labels": 17.0}
    failed = promote | {"action": "canary rollback", "status": "FAILURE"}
    step = promote | {"action": "canary advance"}
    reports = {"2013-06": actions(promote, failed, step), "2013-07": actions(promote), "2013-08": {}}
    assert compare_years.decisions(reports) == [
        compare_years.Decision(date(2013, 6, 17), "promote", "delay_model.loop-v5", 17.0)
    ]
