"""Which landed days rebuild which month (keel/loop/arrivals.py), as tables: new days rebuild their month once, a
month is complete at its last day, and a stepped replay builds a week of new days together."""

from __future__ import annotations

import pytest

from keel.loop.arrivals import Landed, arrivals


@pytest.mark.parametrize(
    "landed, seen, expected",
    [
        # nothing new: nothing to build
        ({"2013-04": Landed((3, 4))}, {"2013-04": Landed((3, 4))}, []),
        # a new day of flights: the month is rebuilt, not yet complete
        ({"2013-04": Landed((4, 5))}, {"2013-04": Landed((3, 4))}, [("2013-04", "landing:2013-04:4-5", False)]),
        # weather only, no flights yet in May: nothing for May
        ({"2013-04": Landed((30, 30)), "2013-05": Landed((0, 1))}, {"2013-04": Landed((29, 30))},
         [("2013-04", "landing:2013-04:30-30", True)]),
        # several months at once (a restart after a long pause): in calendar order
        ({"2013-06": Landed((2, 3)), "2013-05": Landed((31, 31))}, {},
         [("2013-05", "landing:2013-05:31-31", True), ("2013-06", "landing:2013-06:2-3", False)]),
    ],
)  # fmt: skip
def test_new_days_in_the_landing_zone_rebuild_their_month_once(landed, seen, expected):
    got = [(r.month, r.run_key, r.complete) for r in arrivals(landed, seen)]
    assert got == expected


@pytest.mark.parametrize(
    "landed, seen, expected",
    [
        # a stepped replay builds a week of new days together: six wait, the seventh goes
        ({"2013-04": Landed((6, 7))}, {}, []),
        ({"2013-04": Landed((7, 8))}, {}, ["landing:2013-04:7-8"]),
        ({"2013-04": Landed((13, 14))}, {"2013-04": Landed((7, 8))}, []),
        ({"2013-04": Landed((14, 15))}, {"2013-04": Landed((7, 8))}, ["landing:2013-04:14-15"]),
        # the month's last days go at once: it is complete (its drift report waits for them)
        ({"2013-04": Landed((30, 30))}, {"2013-04": Landed((28, 29))}, ["landing:2013-04:30-30"]),
        # new weather only is no new day of the outcomes table
        ({"2013-04": Landed((7, 9))}, {"2013-04": Landed((7, 8))}, []),
    ],
)  # fmt: skip
def test_a_stepped_replay_builds_new_days_a_week_at_a_time(landed, seen, expected):
    assert [r.run_key for r in arrivals(landed, seen, batch_days=7)] == expected
    with pytest.raises(ValueError, match="batch_days"):
        arrivals(landed, seen, batch_days=0)
