"""Fault injection for failing controls, named as such: switches that break one decision of the loop on purpose.

A test that checks the loop decided right must be able to fail when the loop decides wrong. These switches, read from
the environment of the processes that decide (the daemon's runs and sensors inherit `scripts/up`'s), break one
decision each, so a person can run the known-outcome test with one on and watch it fail (docs/live.md, "The data
drill"):

- ``KEEL_FAULT_GATE=always-pass`` — the challenger gate (assets/challengers.py) passes its best candidate whatever
  the evidence: a challenger that is worse than the champion gets a canary.
- ``KEEL_FAULT_PROMOTION=off`` — the canary controller (keel/canary_control.py) never promotes: a canary whose last
  step passed holds there instead (the canary sensor's skip reason names the switch).

Unset (the default) they change nothing. A value a switch does not know is an error naming the switch and its values,
so a typo cannot quietly leave the fault off. A gate a switch passed says so in its reason.

They cannot be set silently, nor by accident in production (issue 61 item 4):

- a switch is **refused** (``FaultError``, naming it and the way out) unless ``$KEEL_HOME`` is a test home
  (keel/home.py: one a test run made) or ``KEEL_ALLOW_FAULTS=1`` says a person injects it knowingly;
- every process that reads them **announces** them when it starts (``announce_faults``: the code location, so the
  webserver, the daemon and every run; ``scripts/materialize.py``) on its standard error, and records an open
  critical incident ``fault:<SWITCH>`` — ``keel incidents`` lists it until a person resolves it
  (``keel incidents resolve fault:<SWITCH>``: only a person knows that no process still has it set);
- the assets they change carry ``fault_injected`` in their materializations' metadata (``fault_metadata``).
"""

from __future__ import annotations

import os
import sys

from keel.clock import SimClock
from keel.errors import KeelError
from keel.home import KeelHome
from keel.incidents import IncidentLog

FAULTS: dict[str, tuple[str, ...]] = {"KEEL_FAULT_GATE": ("always-pass",), "KEEL_FAULT_PROMOTION": ("off",)}
EFFECTS = {
    "KEEL_FAULT_GATE": "the challenger gate passes a candidate whatever the evidence",
    "KEEL_FAULT_PROMOTION": "no canary is ever promoted: a finished canary holds at its last step",
}
ALLOW = "KEEL_ALLOW_FAULTS"


class FaultError(KeelError):
    """A fault switch set to a value it does not know, or set where faults are not allowed."""


def faults_allowed() -> bool:
    """Whether fault switches may be set here: ``$KEEL_HOME`` is a test home, or ``KEEL_ALLOW_FAULTS=1``."""
    return os.environ.get(ALLOW, "").strip() == "1" or KeelHome.from_env().is_test_home


def fault(name: str) -> str | None:
    """The value of the fault switch ``name`` (one of FAULTS), or None when it is not set. A switch set outside a test
    home without ``KEEL_ALLOW_FAULTS=1`` is refused."""
    if name not in FAULTS:
        raise FaultError(f"{name} is not a fault switch (they are: {', '.join(FAULTS)})")
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if value not in FAULTS[name]:
        raise FaultError(f"{name}={value!r}: not a value of this fault switch (one of: {', '.join(FAULTS[name])})")
    if not faults_allowed():
        raise FaultError(
            f"{name}={value} is set, but $KEEL_HOME ({KeelHome.from_env().root}) is not a test home: a fault switch "
            f"breaks a decision of the loop on purpose ({EFFECTS[name]}). Unset it, or set {ALLOW}=1 to inject it "
            'knowingly (docs/live.md, "The data drill")'
        )
    return value


def active_faults() -> dict[str, str]:
    """Every fault switch set here, by name (each checked as ``fault`` checks it)."""
    return {name: value for name in FAULTS if (value := fault(name))}


def fault_metadata() -> dict[str, str]:
    """What an asset a switch changes adds to its materialization's metadata: ``fault_injected`` naming every switch
    set, or nothing."""
    faults = active_faults()
    return {"fault_injected": "; ".join(f"{n}={v}: {EFFECTS[n]}" for n, v in faults.items())} if faults else {}


def announce_faults(process: str) -> dict[str, str]:
    """At the start of a ``process`` that reads the switches: refuse them where they are not allowed (``fault``),
    else say each on standard error and record it as an open critical incident ``fault:<SWITCH>`` in the home's
    incident log (one per switch: a restarted process updates it). Returns the switches set."""
    faults = active_faults()
    if not faults:
        return faults
    home = KeelHome.from_env()
    now = SimClock(home.clock).now().isoformat(timespec="seconds")  # the shared clock: a replay's time in a replay
    with IncidentLog(home.incidents) as log:
        for name, value in faults.items():
            print(f"keel: FAULT INJECTED in {process}: {name}={value} — {EFFECTS[name]}", file=sys.stderr, flush=True)
            log.open_incident(
                f"fault:{name}",
                "fault",
                "critical",
                f"fault switch {name}={value} is set: {EFFECTS[name]}",
                located=f"the environment of {process}",
                injected_at=now,
                detected_at=now,
                source=process,
                details={
                    "switch": name,
                    "value": value,
                    "allowed_by": ALLOW if os.environ.get(ALLOW) else "test home",
                },
            )
    return faults


def injected(name: str) -> str:
    """How a decision a switch changed says so: ``fault injected (NAME=value)``."""
    return f"fault injected ({name}={fault(name)})"


def gate_verdict(passed: bool, reason: str, candidate: str) -> tuple[bool, str]:
    """The challenger gate's verdict as the loop acts on it: as judged, unless ``KEEL_FAULT_GATE=always-pass`` passes
    the best ``candidate`` of a refused decision (and the reason says so)."""
    if passed or not fault("KEEL_FAULT_GATE"):
        return passed, reason
    return True, f"{injected('KEEL_FAULT_GATE')}: {candidate} passed regardless — {reason}"
