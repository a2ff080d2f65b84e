"""scripts/test's phases (tests/parallel.py): the tests that share a running platform stay together on one worker, in
their order, and go out first; a test that floods the machine never runs beside another."""

from __future__ import annotations

import re

from tests import REPO
from tests.parallel import SHARED_PLATFORMS, group_of


def test_the_tests_of_one_platform_are_one_group_and_every_other_module_its_own():
    assert group_of("tests/test_live_drills.py::test_unit_change") == group_of("tests/test_live_year.py::test_x")
    assert group_of("tests/webserver/test_data.py::test_a") == group_of("tests/webserver/test_models.py::test_b")
    assert group_of("tests/test_live_year.py::t") != group_of("tests/webserver/test_data.py::t")
    assert group_of("tests/serving/test_gateway.py::test_a[1]") == "tests/serving/test_gateway.py"


def test_every_module_that_uses_a_shared_platform_is_in_its_group():
    """A module using the session's live platform (or the webserver folder's) on another worker would start a second
    one, and find the first's phase wrong: every user of those fixtures is listed in ``SHARED_PLATFORMS``."""
    users = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if re.search(r"def \w+\([^)]*\b(year_platform|dagster_dev)\b", path.read_text())  # a fixture it asks for
    }
    assert users and all(group_of(u) in SHARED_PLATFORMS.values() for u in users), sorted(users)
