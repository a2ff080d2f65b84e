"""The real thing for the tests of this folder: `dagster dev` (webserver + daemon) on 127.0.0.1 behind keel's UI guard,
with the model runtime, into a throwaway KEEL_HOME — as scripts/up starts them —, and the pipeline materialized
through it by scripts/materialize.py for all twelve months, so every check has results and every run belongs to a
job. One platform for the folder (package scope): started before its first test, stopped after its last. Its
modules run in name order: the data (test_data), the model (test_models), the UI's guard (test_ui_guard)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import REPO
from tests.dagster_support import DAGSTER, free_port, home_env


@pytest.fixture(scope="package")
def keel_home(tmp_path_factory) -> Path:
    """A KEEL_HOME with the model runtime (Triton + gateway) running, as scripts/up starts it."""
    home = tmp_path_factory.mktemp("keel_home")
    (home / "dagster_home").mkdir()
    shutil.copy(REPO / "scripts" / "dagster.yaml", home / "dagster_home" / "dagster.yaml")  # as scripts/env.sh
    env = home_env(home)
    serve = subprocess.Popen(
        [sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(free_port())],
        cwd=REPO,
        env=env,
        stdout=open(home / "serve.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (home / "serving" / "endpoints.json").exists():
            assert serve.poll() is None and time.monotonic() < deadline, (home / "serve.log").read_text()[-3000:]
            time.sleep(0.2)
        yield home
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)


@pytest.fixture(scope="package")
def dagster_dev(keel_home):
    """`dagster dev` on a free loopback port, and the pipeline materialized through it by scripts/materialize.py."""
    home, env = keel_home, home_env(keel_home)
    port, internal = free_port(), free_port()  # the UI's port (the guard, keel/uiguard.py) and the webserver's
    log = open(home / "dagster_dev.log", "wb")
    guard = subprocess.Popen(
        [sys.executable, "-m", "keel.uiguard", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{internal}"],
        cwd=REPO, env=env, stdout=open(home / "uiguard.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    proc = subprocess.Popen(
        [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(internal)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # dagster dev spawns the webserver, daemon and code server: stop them as a group
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dagster dev did not come up: {(home / 'dagster_dev.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(1)
        # The whole pipeline — through training, promotion and deployment — launched through the webserver.
        done = subprocess.run(
            [sys.executable, "scripts/materialize.py", "--port", str(port)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        (home / "materialize.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield port
    finally:
        guard.terminate()
        guard.wait(timeout=30)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
