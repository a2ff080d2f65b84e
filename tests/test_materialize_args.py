"""A simulated instant as a user types it (``KEEL_LIVE_END`` → ``scripts/materialize.py --end``, ``keel live run
--to``/``--from``; keel/clock.py ``instant``): a date (no zone) stops the clock there instead of failing with a
traceback, a zone is kept as the same instant, and what is not a date is refused naming the option."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from keel.clock import ClockError, instant
from tests import REPO


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("2013-05-25", datetime(2013, 5, 25, tzinfo=UTC)),  # a date: its midnight, UTC
        ("2013-07-01T12:00:00", datetime(2013, 7, 1, 12, tzinfo=UTC)),
        ("2013-07-01T12:00:00+00:00", datetime(2013, 7, 1, 12, tzinfo=UTC)),
        ("2013-07-01T14:00:00+02:00", datetime(2013, 7, 1, 12, tzinfo=UTC)),  # its own zone: the same instant
    ],
)
def test_an_instant_is_a_date_or_a_date_time_utc_when_it_names_no_zone(text, at):
    got = instant(text)
    assert got == at and got.utcoffset().total_seconds() == 0


def test_what_is_not_a_date_is_refused_by_the_drivers_parser_naming_the_option(tmp_path):
    with pytest.raises(ClockError, match="'May 25' is not a date"):
        instant("May 25")
    done = subprocess.run([sys.executable, "scripts/materialize.py", "--port", "1", "--live", "--end", "May 25"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "argument --end: 'May 25' is not a date (YYYY-MM-DD)" in done.stderr
