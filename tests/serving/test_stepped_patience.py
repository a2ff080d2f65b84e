"""A stepped replay's traffic does not depend on how busy the machine is (issue 62): a request the real gateway
refuses before doing any work (503 shed, with Retry-After) is asked again, so every request of the step is answered
and the canary's evidence is the same on any machine. Here the gateway admits one flights (L2) request at a time and
the replayer sends eight at once: most are shed on the first try."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from keel.clock import TRAFFIC, SimClock
from keel.exposure_log import read_exposures
from tests import REPO
from tests.serving.conftest import PATIENT, serving_version_1
from tests.serving.test_stepped_traffic import summary_at

NOON = datetime(2013, 6, 1, 12, tzinfo=UTC)
PER_DAY = 40
ONE_AT_A_TIME = PATIENT | {"admit_in_flight": {"L1": 4096, "L2": 1, "L3": 4096}, "lanes": {1: 1, 2: 1, 3: 1}}


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    SimClock(runtime_home / "clock.json").start(NOON, stepped=True, sim_end=NOON + timedelta(hours=1))
    with serving_version_1(runtime_home, serving_models[0], ONE_AT_A_TIME) as rt:
        yield rt


def test_a_steps_requests_refused_for_load_are_asked_again_until_answered(runtime):
    summary = runtime.home / "serving" / "live_traffic" / "flights.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_runtime.replay",
            "--live",
            "--usecase",
            "flights",
            "--url",
            runtime.url,
            "--per-day",
            str(PER_DAY),
            "--max-in-flight",
            "8",
        ],
        cwd=REPO,
        env=os.environ | {"KEEL_HOME": str(runtime.home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        SimClock(runtime.home / "clock.json").set_phase(TRAFFIC)
        step = summary_at(summary, 0, proc)
        proc.terminate()  # as scripts/up stops it
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, out
    assert (step["sent"], step["ok"], step["failed"]) == (PER_DAY, PER_DAY, 0), step
    assert step["retried"] > 0, step  # the gateway did shed: the test is about its refusals
    assert json.loads(summary.read_text())["failed"] == 0
    log = list(read_exposures(runtime.home / "serving" / "exposures"))
    refused = [r for r in log if r.get("status") == 503 and r.get("error") == "shed"]
    answered = [r for r in log if r.get("status") == 200]
    assert len(refused) == step["retried"] and len({r["unit_id"] for r in answered}) == PER_DAY
