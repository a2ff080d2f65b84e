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
