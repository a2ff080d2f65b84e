"""TERM to the main command mid-replay stops everything it started (issue 46 item 5).

`scripts/up` stops its children in an EXIT trap. Under `set -e`, `kill -TERM "$MAT_PID" && wait "$MAT_PID"` returned
143 (the replay's own TERM status) and the trap left before its other kills: the gateway, Triton, the UI guard and
`dagster dev` stayed up. This runs the real script into a throwaway home, sends TERM once the replay is building the
history, and looks for any process of that home still alive."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests import REPO
from tests.dagster_support import free_port
from tests.leftovers import kill_all, leftovers, wait_for_leftovers
from tests.live_platform import wait_until

pytestmark = pytest.mark.slow


def test_term_to_the_main_command_mid_replay_leaves_no_process_of_its_home(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "DAGSTER_"))}
    env.update(
        KEEL_HOME=str(home), DAGSTER_HOME=str(home / "dagster_home"), KEEL_PORT=str(free_port()),
        KEEL_GATEWAY_PORT=str(free_port()), KEEL_USECASES="flights", KEEL_WITH_FLINK="0",
    )  # fmt: skip
    out = tmp_path / "up.log"
    up = subprocess.Popen(["scripts/up"], cwd=REPO, env=env, stdout=open(out, "wb"), stderr=subprocess.STDOUT)
    try:
        # mid-replay: the replay (scripts/materialize.py, the child the old trap stopped on) is launching runs
        wait_until("the replay builds the history", lambda: "history job 1/" in out.read_text() or up.poll() is not None,
                   600, 1)  # fmt: skip
        assert up.poll() is None, f"scripts/up ended before the replay began:\n{out.read_text()[-3000:]}"
        up.send_signal(signal.SIGTERM)
        rc = up.wait(timeout=180)
        assert rc == 143, f"exit status {rc} (143 says it was stopped by TERM):\n{out.read_text()[-2000:]}"
        left = wait_for_leftovers([str(home)], grace_s=60)
        assert not left, f"still running after TERM to scripts/up: {left}"
    finally:
        if up.poll() is None:
            up.kill()
        kill_all(leftovers([str(home)]))  # what the failed assertion named: not left to the next tests
