"""The reproducible replay's traffic on the real model runtime: on a stepped clock the replayer sends exactly its
``--per-day`` requests of each step's day — the same entities on every run, spread over the day — only in the step's
traffic phase, says so in its summary, and stops by itself after the last step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from gpu_runtime.live_traffic import day_sample, entities_by_day
from keel.clock import TRAFFIC, SimClock
from keel.exposure_log import read_exposures
from keel.usecase import get
from tests import REPO
from tests.serving.conftest import PATIENT, serving_version_1

NOON = datetime(2013, 6, 1, 12, tzinfo=UTC)
PER_DAY = 30


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    clock = SimClock(runtime_home / "clock.json")
    clock.start(NOON, stepped=True, sim_end=NOON + timedelta(days=1))
    with serving_version_1(runtime_home, serving_models[0], PATIENT) as rt:
        yield rt


def summary_at(path, step: int, proc, timeout: float = 180.0) -> dict:
    """The replayer's summary once it has answered ``step``'s traffic (bounded wait on the file, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        if data.get("step") is not None and data["step"] >= step:
            return data
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"step {step}'s traffic was not answered: {data}"
        time.sleep(0.1)


def test_each_step_gets_its_days_requests_and_nothing_while_it_settles(runtime):
    clock = SimClock(runtime.home / "clock.json")
    summary = runtime.home / "serving" / "live_traffic" / "flights.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_runtime.replay", "--live", "--usecase", "flights", "--url", runtime.url,
         "--per-day", str(PER_DAY), "--max-in-flight", "4"],
        cwd=REPO, env=os.environ | {"KEEL_HOME": str(runtime.home)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        clock.set_phase(TRAFFIC)
        first = summary_at(summary, 0, proc)
        assert (first["sent"], first["ok"], first["failed"]) == (PER_DAY, PER_DAY, 0)
        clock.step_to(NOON + timedelta(days=1))  # settling: the replayer waits for the traffic phase
        clock.set_phase(TRAFFIC)
        second = summary_at(summary, 1, proc)
        assert (second["sent"], second["ok"], second["failed"]) == (2 * PER_DAY, 2 * PER_DAY, 0)
        out, _ = proc.communicate(timeout=120)  # the clock is at its end and its step is sent: it stops itself
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, out
    final = json.loads(summary.read_text())
    assert final["finished"] and (final["sent"], final["step"]) == (2 * PER_DAY, 1)
    uc = get("flights")
    days = entities_by_day(uc)
    for step, day in enumerate(("2013-06-01", "2013-06-02")):
        at = (NOON + timedelta(days=step)).timestamp()
        log = [r for r in read_exposures(runtime.home / "serving" / "exposures") if r["ts"] == at]
        expected = sorted(uc.replay.unit_of(e) for e in day_sample(days[day], PER_DAY))
        assert sorted(r["unit_id"] for r in log) == expected  # the same spread of the day's flights on every run
        assert len(set(expected)) == PER_DAY  # spread over the day: no flight twice
