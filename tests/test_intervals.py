"""keel/intervals.py: the split-conformal half-width is the right order statistic, covers what it declares on rows
like its calibration's, and says when it cannot."""

from __future__ import annotations

import numpy as np
import pytest

from keel import intervals


def test_the_half_width_is_the_ceil_n_plus_1_times_coverage_th_smallest_residual():
    residuals = np.array([-5.0, 1.0, 3.0, -2.0, 4.0, 0.5, -6.0, 7.0, 8.0, -9.0, 10.0, 2.5, 11.0, -12.0, 13.0,
                          -14.0, 15.0, 16.0, -17.0])  # fmt: skip
    # n = 19, coverage 0.9: rank ⌈20 · 0.9⌉ = 18 of the sorted |r| (1…17 and 0.5, 2.5): 16
    assert intervals.conformal_half_width(residuals, 0.9) == 16.0
    assert intervals.conformal_half_width(residuals, 0.5) == 8.0  # rank 10


def test_the_rank_is_n_plus_1_not_n():
    """At n = 20 the two ranks differ (issue 61 item 16: at n = 19 ⌈n·α⌉ = ⌈(n+1)·α⌉ for both coverages above, so
    that test could not tell them apart): 90 % → ⌈21 · 0.9⌉ = 19, not ⌈18⌉ = 18; 50 % → ⌈10.5⌉ = 11, not 10."""
    residuals = np.array([(-1.0) ** i * i for i in range(1, 21)])  # |r| = 1 … 20
    assert intervals.conformal_half_width(residuals, 0.9) == 19.0
    assert intervals.conformal_half_width(residuals, 0.5) == 11.0


def test_too_few_rows_for_the_coverage_is_an_error_that_says_how_many():
    with pytest.raises(ValueError, match="8 calibration rows are too few for a 90% interval"):
        intervals.conformal_half_width(np.arange(8.0), 0.9)
    with pytest.raises(ValueError, match="must be in"):
        intervals.conformal_half_width(np.arange(100.0), 1.0)
    with pytest.raises(ValueError, match="not finite"):
        intervals.conformal_half_width(np.array([1.0, np.nan] * 20), 0.9)


@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95])
def test_on_fresh_rows_from_the_same_distribution_the_interval_covers_what_it_declares(coverage):
    rng = np.random.default_rng(46)
    x = rng.uniform(50, 150, size=4000)
    truth = lambda v: 0.9 * v + 5  # noqa: E731 - the model's guess; the label has heavy-tailed noise around it
    y = truth(x) + rng.standard_t(3, size=x.size) * 8
    fitted = intervals.fit(truth(x[:2000]), y[:2000], coverage, "calibration half")
    realized = intervals.realized_coverage(truth(x[2000:]), y[2000:], fitted.half_width)
    assert abs(realized - coverage) < 0.03, (realized, fitted)
    # and a shifted label (drift) breaks it: the guarantee holds only for rows like the calibration's
    assert intervals.realized_coverage(truth(x[2000:]), y[2000:] * 1.5, fitted.half_width) < coverage - 0.3


def test_an_interval_round_trips_through_a_registry_record():
    fitted = intervals.fit(np.zeros(50), np.arange(50.0), 0.9, "2016-10")
    record = {intervals.INTERVAL_KEY: fitted.as_metadata()}
    assert intervals.Interval.from_metadata(record) == fitted
    assert intervals.Interval.from_metadata({}) is None


def test_a_months_coverage_is_held_within_3_points_of_the_declared_and_a_miss_says_which_way():
    from keel.intervals import COVERAGE_TOLERANCE, coverage_held

    assert COVERAGE_TOLERANCE == 0.03
    held, why = coverage_held(0.885, 0.9)
    assert held and why.startswith("88.5% of the month's labels fell inside") and "declared 90%" in why
    assert coverage_held(0.93, 0.9)[0] and coverage_held(0.87, 0.9)[0]  # the bounds are held
    low, why = coverage_held(0.441, 0.9)  # the third table's served months (BENCHMARKS.md "Interval coverage")
    assert not low and "45.9 points below: the interval promised more than it held" in why
    high, why = coverage_held(0.993, 0.9)
    assert not high and "9.3 points above: it was wider than it needed" in why
    assert coverage_held(None, 0.9) == (True, "no labelled answer carried an interval this month")
