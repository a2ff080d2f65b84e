"""The failing controls' switches (keel/faults.py): off unless set, and a value they do not know is an error naming
the switch — a typo must not quietly leave a fault off while a person believes it on."""

from __future__ import annotations

import pytest

from keel.faults import FAULTS, FaultError, fault, gate_verdict, injected


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
