"""The session's own guards (tests/leftovers.py): a process started with TERM ignored gets it back, and a process
of a session's home still alive at its end is found (conftest.py fails the session on it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from keel.home import is_test_home, mark_test_home
from tests import REPO
from tests.leftovers import kill_all, leftovers

IGNORING = "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "


def test_a_process_started_with_term_ignored_gets_the_default_back_and_so_do_its_children():
    child = (
        IGNORING + "import subprocess; from tests.leftovers import restore_default_signals; "
        "print(restore_default_signals()); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', 'import signal; print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)'])"
    )
    # the child starts a grandchild with TERM ignored inherited through exec, unless it was restored
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=os.getcwd(), check=True)
    assert out.stdout.split("\n")[:2] == ["['SIGTERM']", "True"], out


def test_a_process_of_the_sessions_home_still_alive_is_found_and_one_elsewhere_is_not(tmp_path):
    home = tmp_path / "home"
    env = os.environ | {"KEEL_HOME": str(home)}
    stray = subprocess.Popen([sys.executable, "-c", IGNORING + "import time; time.sleep(120)"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env=os.environ | {"KEEL_HOME": str(tmp_path / "elsewhere")})  # fmt: skip
    try:
        found = leftovers([str(home)])
        assert stray.pid in found and other.pid not in found
        stray.send_signal(signal.SIGTERM)  # ignored: TERM does not stop it
        assert stray.poll() is None
    finally:
        kill_all([stray.pid, other.pid])
        stray.wait(timeout=30), other.wait(timeout=30)
    assert stray.pid not in leftovers([str(home)])


def test_a_root_is_matched_whole_not_as_the_prefix_of_another_sessions(tmp_path):
    """``pytest-1`` is not a prefix of ``pytest-12``: another session's processes are not this one's."""
    (tmp_path / "pytest-12").mkdir()
    neighbour = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env=os.environ | {"KEEL_HOME": str(tmp_path / "pytest-12" / "home")},
    )
    try:
        assert neighbour.pid not in leftovers([str(tmp_path / "pytest-1")])
        assert neighbour.pid in leftovers([str(tmp_path / "pytest-12")])
    finally:
        kill_all([neighbour.pid])
        neighbour.wait(timeout=30)


def test_a_platform_on_a_home_the_run_was_handed_survives_the_test_run():
    """Issue 61 item 17: ``pytest`` with KEEL_HOME exported as a running platform's home (not a test home) stops only
    what it started. The "platform" is a process whose environment names that home, as Triton's, the gateway's and
    ``dagster dev``'s do; a whole test session (collect-only, as seen) runs beside it and it is still alive after."""
    user_home = Path(tempfile.mkdtemp(prefix="keel-user-home-"))  # outside every test home: a user's
    assert not is_test_home(user_home)
    env = os.environ | {"KEEL_HOME": str(user_home), "DAGSTER_HOME": str(user_home / "dagster_home")}
    platform = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/test_faults.py",
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert platform.poll() is None, f"the test run stopped the platform it was handed:\n{run.stdout[-2000:]}"
    finally:
        kill_all([platform.pid])
        platform.wait(timeout=30)
        shutil.rmtree(user_home, ignore_errors=True)


def test_the_session_stops_its_own_roots_and_a_test_home_it_was_given_only(tmp_path):
    from tests.conftest import session_roots

    handed = Path(tempfile.mkdtemp(prefix="keel-user-home-"))
    try:
        assert session_roots(tmp_path, str(handed)) == [str(tmp_path)]
        mark_test_home(handed)  # as scripts/test marks the home it makes
        assert session_roots(tmp_path, str(handed)) == [str(tmp_path), str(handed.resolve())]
        assert session_roots(tmp_path, None) == [str(tmp_path)]
    finally:
        shutil.rmtree(handed, ignore_errors=True)
