"""What the main command says when the live year had failed requests (scripts/live_follow.py): how many of how many,
by error code and status, and how much the coarse fallback answered — so a user reads why, not only that."""

from __future__ import annotations

import importlib.util

from tests import REPO


def live_follow():
    spec = importlib.util.spec_from_file_location("keel_live_follow", REPO / "scripts" / "live_follow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reason_line_names_the_failures_by_code_and_status_and_the_coarse_share():
    traffic = {
        "answered": 7946, "ok": 257, "failed": 7689,
        "by_status": {"200": 257, "0": 7002, "503": 687},
        "by_error": {"TimeoutError": 7002, "shed": 600, "deadline_exceeded": 87},
        "by_degraded": {"coarse_fallback": 120},
    }  # fmt: skip
    line = live_follow().why_requests_failed(traffic)
    assert line.startswith("7,689 of 7,946 requests failed")
    assert "TimeoutError 7,002, shed 600, deadline_exceeded 87" in line
    assert "client timeout/transport 7,002" in line and "503 687" in line
    assert "120 answers came from the coarse fallback" in line
