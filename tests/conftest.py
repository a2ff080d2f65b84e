"""Shared fixtures: small contracts written as YAML text, and the repository paths."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import parse_contract
from keel.home import is_test_home, mark_test_home
from tests import REPO
from tests.control_plane import CONTROL_PLANES, TEST_KEY, fresh_location
from tests.leftovers import kill_all, restore_default_signals, wait_for_leftovers
from tests.parallel import add_option, give_the_worker_its_own_home, make_scheduler, select_phase

# Signals the session was started ignoring get their defaults back, so no process a test starts inherits them
# (tests/leftovers.py); the session fails if any process of its homes is still alive at its end.
RESTORED_SIGNALS = restore_default_signals()


def pytest_addoption(parser):
    add_option(parser)


def pytest_configure(config):
    give_the_worker_its_own_home(config)


def pytest_collection_modifyitems(config, items):
    select_phase(config, items)


def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log)


def pytest_sessionstart(session):
    # Every home a test makes lives under the session's temporary root: marked, they are test homes (keel/home.py).
    mark_test_home(session.config._tmp_path_factory.getbasetemp())


def session_roots(basetemp: Path, keel_home: str | None) -> list[str]:
    """The homes whose processes are this session's to stop at its end: its own temporary root, and ``keel_home``
    only when it is a test home (scripts/test made it) — a home the session was merely handed (a running
    platform's, exported in the shell) is never the session's (issue 61 item 17)."""
    roots = [str(basetemp)]
    if keel_home and Path(keel_home).is_dir() and is_test_home(keel_home):
        roots.append(str(Path(keel_home).resolve()))
    return roots


def pytest_sessionfinish(session, exitstatus):
    roots = session_roots(session.config._tmp_path_factory.getbasetemp(), os.environ.get("KEEL_HOME"))
    found = wait_for_leftovers(roots)
    if found:
        kill_all(found)
        lines = "\n".join(f"  {pid}: {cmd}" for pid, cmd in sorted(found.items()))
        print(f"\nprocesses the tests started were still running at the session's end (killed now):\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if RESTORED_SIGNALS:
        print(f"\nthe session was started with {', '.join(RESTORED_SIGNALS)} ignored: restored to the defaults")


def make_contract(columns: str, rules: str = "", **top: object) -> CompiledContract:
    """Build a compiled contract from YAML snippets (indentation-insensitive)."""
    header = {"contract": "t", "version": 1} | top
    head = "\n".join(f"{k}: {v}" for k, v in header.items())
    text = f"{head}\nschema:\n  columns:\n{textwrap.indent(textwrap.dedent(columns).strip(), '    ')}\n"
    if rules:
        text += "rules:\n" + textwrap.indent(textwrap.dedent(rules).strip(), "  ") + "\n"
    return CompiledContract(parse_contract(text, source="test.yaml"))


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(params=CONTROL_PLANES)
def backend(request, monkeypatch) -> str:
    """A control-plane test runs on each backend (tests/control_plane.py): SQLite, and the machine's real Postgres
    with the test chain key in the environment (a Postgres control plane has no key file)."""
    if request.param == "postgres":
        monkeypatch.setenv("KEEL_CHAIN_KEY", TEST_KEY)
    return request.param


@pytest.fixture
def location(backend, tmp_path):
    """A fresh control-plane location on ``backend``: a SQLite file, or a schema of its own on Postgres."""
    with fresh_location(backend, tmp_path) as loc:
        yield loc


def evaluate_sensor(name: str, home, monkeypatch):
    """One tick of the deployment's sensor ``name`` as the daemon runs it (``evaluate_tick``), with every resource on
    ``home`` — the sensors read KEEL_HOME through ``dg.EnvVar``, so it is set for the tick."""
    import dagster as dg

    import definitions
    from resources import keel_resources

    monkeypatch.setenv("KEEL_HOME", str(home))
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(
            instance=instance, definitions=definitions.defs, resources=keel_resources(home)
        ) as ctx:  # closed here, while its instance lives
            return definitions.defs.get_sensor_def(name).evaluate_tick(ctx)


@pytest.fixture(scope="session")
def alert_receiver():
    """The on-call's webhooks, on 127.0.0.1, for the session's live platform (tests/test_alerts.py's Receiver)."""
    from tests.test_alerts import Receiver

    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="session")
def year_platform(tmp_path_factory, alert_receiver):
    """The one live platform of the session (tests/live_platform.py: runtime, `dagster dev`, the live year), shared by
    the chaos drills (in its April) and the live-year tests after them."""
    from tests.live_platform import shared_year

    with shared_year(tmp_path_factory.mktemp("live_home"), alert_receiver.url) as platform:
        yield platform
