"""How scripts/test runs the suite in two phases (docs: README "Tests").

The suite waits far more than it computes — on servers coming up, on a simulated clock, on Dagster runs — and one
pytest process keeps one of the machine's two cores busy at a time (vmstat over a whole run: the CPU idle about half
of it). So scripts/test runs it in two phases:

- ``alone``: the tests marked ``alone`` (they flood or starve the machine on purpose, or judge what a tier gets
  under that load), one after another, with nothing beside them — their load generator is pinned to a core of its
  own, and a neighbour's work on the server's core would be measured as the server's;
- ``shared``: everything else on two pytest-xdist workers (``-n 2``, scheduled by ``GroupScheduling``). Tests that share a running
  platform stay on one worker, in their order: the session's live platform (the chaos drills, then the live year) and
  the webserver folder's platform are a group each, handed out first (they are the longest); every other module is a
  group of its own, so its module fixtures are built once.

Each worker gets a test home of its own (a sibling of the run's, never inside it: tests/leftovers.py stops what
names a home at the end of the session that owns it, and a worker must not stop its neighbour's processes)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from keel.home import mark_test_home
from tests import REPO

PHASES = ("all", "alone", "shared")
# Groups that share a running platform, in the order their modules must run; handed out before every other group.
SHARED_PLATFORMS = {
    "tests/test_live_drills.py": "live_platform",
    "tests/test_live_year.py": "live_platform",
    "tests/webserver/": "webserver_platform",
}


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--keel-phase",
        choices=PHASES,
        default="all",
        help="scripts/test's phases (tests/parallel.py): 'alone' runs only the tests marked alone, 'shared' all "
        "others; 'all' (the default) runs every test in this one process",
    )


def worker_id(config: pytest.Config) -> str | None:
    return getattr(config, "workerinput", {}).get("workerid")


def give_the_worker_its_own_home(config: pytest.Config) -> None:
    """On an xdist worker: a fresh test home for ``KEEL_HOME`` and ``DAGSTER_HOME`` (never the one the run was
    handed, which every worker would share)."""
    worker = worker_id(config)
    if worker is None:
        return
    home = Path(tempfile.mkdtemp(prefix=f"keel-test-{worker}-"))
    mark_test_home(home)
    dagster_home = home / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO / "scripts" / "dagster.yaml", dagster_home / "dagster.yaml")  # as scripts/env.sh
    os.environ["KEEL_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(dagster_home)


def group_of(nodeid: str) -> str:
    for prefix, group in SHARED_PLATFORMS.items():
        if nodeid.startswith(prefix):
            return group
    return nodeid.split("::", 1)[0]


def select_phase(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the phase's tests (``--keel-phase``), deselect the others; on an xdist worker, order the collection
    with the shared platforms' groups first (``GroupScheduling`` hands the groups out in that order)."""
    phase = config.getoption("--keel-phase")
    if phase != "all":
        keep = [i for i in items if (i.get_closest_marker("alone") is not None) == (phase == "alone")]
        kept = {id(i) for i in keep}
        dropped = [i for i in items if id(i) not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if worker_id(config) is not None:
        shared = set(SHARED_PLATFORMS.values())
        items.sort(key=lambda i: group_of(i.nodeid) not in shared)  # stable: each group's order kept


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with ``group_of`` as the scope: a group's tests go to one worker, in their order,
    and groups go out in the order of the (sorted) collection — shared platforms first.

    Not ``--dist loadgroup``: xdist 3.8 marks a group by appending ``@group`` to ``item._nodeid``, which pytest 9 no
    longer reads (a node's id is ``_id``), so every test silently became a group of its own and a module's ordered
    tests ran on both workers."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def make_scheduler(config: pytest.Config, log) -> GroupScheduling | None:
    """The controller's scheduler for the shared phase (``-n``); None leaves xdist's own."""
    if config.getoption("--keel-phase") != "shared":
        return None
    config.option.loadscopereorder = False  # keep the collection's order of groups: the shared platforms first
    return GroupScheduling(config, log)
