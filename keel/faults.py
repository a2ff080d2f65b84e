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
"""

from __future__ import annotations

import os

from keel.errors import KeelError

FAULTS: dict[str, tuple[str, ...]] = {"KEEL_FAULT_GATE": ("always-pass",), "KEEL_FAULT_PROMOTION": ("off",)}


class FaultError(KeelError):
    """A fault switch set to a value it does not know."""


def fault(name: str) -> str | None:
    """The value of the fault switch ``name`` (one of FAULTS), or None when it is not set."""
    if name not in FAULTS:
        raise FaultError(f"{name} is not a fault switch (they are: {', '.join(FAULTS)})")
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if value not in FAULTS[name]:
        raise FaultError(f"{name}={value!r}: not a value of this fault switch (one of: {', '.join(FAULTS[name])})")
    return value


def injected(name: str) -> str:
    """How a decision a switch changed says so: ``fault injected (NAME=value)``."""
    return f"fault injected ({name}={fault(name)})"


def gate_verdict(passed: bool, reason: str, candidate: str) -> tuple[bool, str]:
    """The challenger gate's verdict as the loop acts on it: as judged, unless ``KEEL_FAULT_GATE=always-pass`` passes
    the best ``candidate`` of a refused decision (and the reason says so)."""
    if passed or not fault("KEEL_FAULT_GATE"):
        return passed, reason
    return True, f"{injected('KEEL_FAULT_GATE')}: {candidate} passed regardless — {reason}"
