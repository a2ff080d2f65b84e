"""The session's own guards (tests/leftovers.py): a process started with TERM ignored gets it back, and a process
of a session's home still alive at its end is found (conftest.py fails the session on it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

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
