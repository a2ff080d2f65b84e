"""The failing controls' switches (keel/faults.py): off unless set, and a value they do not know is an error naming
the switch — a typo must not quietly leave a fault off while a person believes it on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from keel.faults import (
    ALLOW,
    EFFECTS,
    FAULTS,
    FaultError,
    announce_faults,
    fault,
    fault_metadata,
    faults_allowed,
    gate_verdict,
    injected,
)
from keel.home import KeelHome, mark_test_home
from keel.incidents import IncidentLog
from tests import REPO


@pytest.fixture(autouse=True)
def test_home(tmp_path, monkeypatch):
    """Each test's home is under the session's marked root: a test home, where switches are allowed."""
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))


def test_a_switch_is_off_unless_set_and_says_what_it_injected(monkeypatch):
    for name in FAULTS:
        monkeypatch.delenv(name, raising=False)
        assert fault(name) is None
    monkeypatch.setenv("KEEL_FAULT_GATE", "always-pass")
    assert fault("KEEL_FAULT_GATE") == "always-pass"
    assert injected("KEEL_FAULT_GATE") == "fault injected (KEEL_FAULT_GATE=always-pass)"
    monkeypatch.setenv("KEEL_FAULT_PROMOTION", " ")
    assert fault("KEEL_FAULT_PROMOTION") is None


def test_an_unknown_value_or_switch_is_named(monkeypatch):
    monkeypatch.setenv("KEEL_FAULT_GATE", "always-passs")
    with pytest.raises(FaultError, match=r"KEEL_FAULT_GATE='always-passs'.*one of: always-pass"):
        fault("KEEL_FAULT_GATE")
    with pytest.raises(FaultError, match="KEEL_FAULT_GAT is not a fault switch"):
        fault("KEEL_FAULT_GAT")


def test_the_gate_switch_passes_only_what_the_gate_refused_and_says_so(monkeypatch):
    monkeypatch.delenv("KEEL_FAULT_GATE", raising=False)
    assert gate_verdict(False, "log-loss not better: worse by 0.0100", "rolling") == (
        False, "log-loss not better: worse by 0.0100")  # fmt: skip
    monkeypatch.setenv("KEEL_FAULT_GATE", "always-pass")
    assert gate_verdict(False, "log-loss not better: worse by 0.0100", "rolling") == (
        True, "fault injected (KEEL_FAULT_GATE=always-pass): rolling passed regardless — log-loss not better: worse by "
        "0.0100")  # fmt: skip
    assert gate_verdict(True, "better by 0.02", "committee") == (True, "better by 0.02")


@pytest.fixture
def users_home(monkeypatch):
    """A home outside every test home, as a production platform's is."""
    home = Path(tempfile.mkdtemp(prefix="keel-user-home-"))
    monkeypatch.setenv("KEEL_HOME", str(home))
    monkeypatch.delenv(ALLOW, raising=False)
    for name in FAULTS:
        monkeypatch.delenv(name, raising=False)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_a_switch_is_refused_outside_a_test_home_unless_allowed_explicitly(users_home, monkeypatch):
    """Issue 61 item 4: set by accident in production, a switch stops the platform instead of a decision."""
    assert not faults_allowed()
    monkeypatch.setenv("KEEL_FAULT_PROMOTION", "off")
    with pytest.raises(
        FaultError,
        match=r"KEEL_FAULT_PROMOTION=off is set, but \$KEEL_HOME .* is not a test home.*"
        r"KEEL_ALLOW_FAULTS=1",
    ):
        fault("KEEL_FAULT_PROMOTION")
    with pytest.raises(FaultError):
        fault_metadata()
    monkeypatch.setenv(ALLOW, "1")
    assert fault("KEEL_FAULT_PROMOTION") == "off"
    monkeypatch.delenv(ALLOW)
    mark_test_home(users_home)  # now a test run's home
    assert fault("KEEL_FAULT_PROMOTION") == "off"


def test_a_switch_set_is_announced_recorded_as_an_incident_and_shown_on_metadata(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))  # under the session's marked root: a test home
    for name in FAULTS:
        monkeypatch.delenv(name, raising=False)
    assert announce_faults("a test") == {} and fault_metadata() == {}
    assert not (tmp_path / "incidents.sqlite").exists()  # nothing set: nothing written
    monkeypatch.setenv("KEEL_FAULT_GATE", "always-pass")
    assert announce_faults("a test") == {"KEEL_FAULT_GATE": "always-pass"}
    assert "FAULT INJECTED in a test: KEEL_FAULT_GATE=always-pass" in capsys.readouterr().err
    assert fault_metadata() == {"fault_injected": f"KEEL_FAULT_GATE=always-pass: {EFFECTS['KEEL_FAULT_GATE']}"}
    with IncidentLog(KeelHome.from_env().incidents) as log:
        incident = log.get("fault:KEEL_FAULT_GATE")
    assert incident.open and incident.severity == "critical" and incident.source == "a test"
    shown = subprocess.run(
        [sys.executable, "-m", "keel.cli", "incidents"],
        capture_output=True,
        text=True,
        env=os.environ | {"KEEL_HOME": str(tmp_path)},
        cwd=REPO,
        timeout=300,
    )
    assert "[critical] fault: fault switch KEEL_FAULT_GATE=always-pass is set" in shown.stdout, shown.stdout


def test_the_code_location_refuses_to_load_with_a_switch_outside_a_test_home(users_home):
    """The webserver, the daemon and every run load definitions.py: a switch set where it is not allowed fails the
    load with the reason (the UI shows a code location that failed), and scripts/materialize.py stops at once."""
    env = os.environ | {"KEEL_HOME": str(users_home), "KEEL_FAULT_GATE": "always-pass"}
    load = subprocess.run(
        [sys.executable, "-c", "import definitions"], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    assert load.returncode != 0 and "KEEL_FAULT_GATE=always-pass is set, but $KEEL_HOME" in load.stderr
    build = subprocess.run(
        [sys.executable, "scripts/materialize.py", "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert build.returncode == 2 and "is not a test home" in build.stderr


def test_a_fault_is_dated_on_the_shared_clock_and_its_refresh_is_tagged_only_in_a_replay(tmp_path, monkeypatch):
    """Before a replay (a fault announced as the platform comes up) the incidents' refresh carries no simulated
    instant — a wall-clock one would show 2026 on the replay's timeline; in a replay, the incident and the refresh
    are on the replay's clock."""
    from datetime import UTC, datetime

    import dagster as dg

    from keel.clock import SimClock
    from resources.simulated import SIM_TAG
    from tests.test_chaos import sensor_tick

    monkeypatch.setenv("KEEL_FAULT_PROMOTION", "off")
    home = KeelHome.from_env()
    announce_faults("a test")
    with dg.instance_for_test() as instance:
        [before] = sensor_tick("watchdog_sensor", tmp_path, instance).run_requests
    assert before.job_name == "keel_incidents" and SIM_TAG not in before.tags
    SimClock(home.clock).start(datetime(2013, 4, 1, 12, tzinfo=UTC), speed=1.0)  # a minute is plenty
    monkeypatch.setenv("KEEL_FAULT_GATE", "always-pass")
    announce_faults("a test")
    with IncidentLog(home.incidents) as log:
        assert log.get("fault:KEEL_FAULT_GATE").detected_at.startswith("2013-04-01T12:00")
    with dg.instance_for_test() as instance:
        [during] = sensor_tick("watchdog_sensor", tmp_path, instance).run_requests
    assert during.tags[SIM_TAG].startswith("2013-04-01T12:00")
