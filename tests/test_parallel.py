"""scripts/test's phases (tests/parallel.py): the tests that share a running platform stay together on one worker, in
their order, and go out first; a test that floods the machine never runs beside another."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


def test_a_modules_tests_run_on_one_worker_in_their_order_and_the_shared_platforms_go_first(tmp_path):
    """Two real xdist workers on a small suite laid out like ours: each group (a module; the live platform's two
    modules together) runs on one worker, in file order, and the shared platform's group is handed out first."""
    (tmp_path / "tests").mkdir()  # not a package: ``tests`` stays this repository's, for tests.parallel
    (tmp_path / "conftest.py").write_text(
        "from tests.parallel import add_option, make_scheduler, select_phase\n"
        "def pytest_addoption(parser):\n    add_option(parser)\n"
        "def pytest_collection_modifyitems(config, items):\n    select_phase(config, items)\n"
        "def pytest_xdist_make_scheduler(config, log):\n    return make_scheduler(config, log)\n"
    )
    record = tmp_path / "ran.txt"
    body = "import os\n" + "".join(
        f"def test_{i}():\n    with open({str(record)!r}, 'a') as f:\n"
        f"        f.write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + os.path.basename(__file__) + ' {i}\\n')\n"
        for i in range(4)
    )
    for name in ("test_a", "test_b", "test_c", "test_live_drills", "test_live_year"):
        (tmp_path / "tests" / f"{name}.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--keel-phase=shared", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ran = [line.split() for line in record.read_text().splitlines()]
    assert len(ran) == 20
    worker_of: dict[str, set[str]] = {}
    for worker, module, _ in ran:
        worker_of.setdefault(group_of(f"tests/{module}::t"), set()).add(worker)
    assert all(len(workers) == 1 for workers in worker_of.values()), worker_of
    for module in {m for _, m, _ in ran}:
        assert [int(i) for _, m, i in ran if m == module] == [0, 1, 2, 3], module  # in file order
    live = [(w, m) for w, m, _ in ran if "live" in m]
    assert [m for _, m in live] == ["test_live_drills.py"] * 4 + ["test_live_year.py"] * 4  # drills, then year
    first = {w: next(m for w2, m, _ in ran if w2 == w) for w, _, _ in ran}
    assert "test_live_drills.py" in first.values()  # handed out first: one worker starts with it
