"""Watching a chaos drill (keel/chaos.py): what was injected, the incident the platform is expected to record, the
live traffic's answers while the fault lasted, and the wait — bounded — for the platform to detect, act and recover.
Nothing here repairs anything."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Injection:
    drill: str
    incident_key: str  # the incident the platform is expected to open
    what: str
    injected_at: str  # on the shared clock
    details: dict[str, Any] = field(default_factory=dict)


TRAFFIC_WAIT_S = 300.0  # how long a drill's report waits for the live traffic to meet it after recovery


def traffic(home, usecase: str | None = None) -> dict | None:
    """The live traffic's running totals (gpu_runtime.replay --live, one per use case): ``usecase``'s, or every use
    case's added up; None when none is sent."""
    paths = [home.serving.live_traffic(usecase)] if usecase else sorted(home.serving.live_traffic_dir.glob("*.json"))
    totals = []
    for path in paths:
        try:
            totals.append(json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return added_up(totals) if totals else None


def added_up(totals: list[dict]) -> dict:
    """Several traffic totals as one: counts summed, counts by key summed key by key (other fields: the first's)."""
    out: dict[str, Any] = dict(totals[0])
    for t in totals[1:]:
        for key, value in t.items():
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
            elif isinstance(value, dict) and all(isinstance(v, int) for v in value.values()):
                merged = dict(out.get(key) or {})
                for k, v in value.items():
                    merged[k] = merged.get(k, 0) + v
                out[key] = merged
    return out


def traffic_delta(before: dict | None, after: dict | None) -> dict[str, Any] | None:
    """What the live traffic got between two snapshots: answers, failures by status and error, degraded answers."""
    if before is None or after is None:
        return None

    def diff(key: str) -> dict[str, int]:
        a, b = before.get(key) or {}, after.get(key) or {}
        return {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) - a.get(k, 0)}

    answered_before = before.get("answered", 0)
    return {
        "answered": after.get("answered", 0) - answered_before,
        "failed": after.get("failed", 0) - before.get("failed", 0),
        "degraded": after.get("degraded_answers", 0) - before.get("degraded_answers", 0),
        # the share of degraded answers before the drill (features defaulted, frozen, …): what is usual, to read
        # "degraded" against
        "baseline_degraded_share": round(before.get("degraded_answers", 0) / answered_before, 4)
        if answered_before
        else None,
        "by_status": diff("by_status"),
        "by_error": diff("by_error"),
        "by_degraded": diff("by_degraded"),
        "versions": diff("versions"),
    }


@dataclass
class DrillResult:
    injection: Injection
    incident: Any  # keel.incidents.Incident, or None when the platform never opened one
    traffic: dict[str, Any] | None
    detected: bool
    recovered: bool
    waited_s: float

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "drill": self.injection.drill,
            "injection": asdict(self.injection),
            "incident": asdict(self.incident) if self.incident is not None else None,
            "traffic": self.traffic,
            "detected": self.detected,
            "recovered": self.recovered,
            "waited_s": round(self.waited_s, 1),
        }


def watch(home, injection: Injection, timeout_s: float, before: dict | None, progress=None) -> DrillResult:
    """Wait (bounded) for the platform to open the expected incident and recover it; then add what the drill knows
    (injected_at, the traffic during it) to the incident."""
    from keel.incidents import IncidentLog

    start = time.monotonic()
    incident, said = None, set()
    report = Path(injection.details["report"]) if injection.details.get("report") else None
    while time.monotonic() - start < timeout_s:
        with IncidentLog(home.incidents) as log:
            incident = _find(log, injection)
        if incident is not None:
            for step in ("detected_at", "acted_at", "recovered_at"):
                if getattr(incident, step) and step not in said and progress:
                    said.add(step)
                    progress(f"{step.split('_')[0]} at {getattr(incident, step)}")
            if not incident.open and (report is None or report.exists()):
                break
        time.sleep(0.5)
    waited = time.monotonic() - start
    delta = traffic_delta(before, traffic(home))
    if incident is not None and not incident.open:
        # the traffic's totals are rewritten every 5 s: let them cover the recovery — at least 6 s, and until the
        # replay has answered a request since the drill began (a busy machine holds the clock, and its traffic, while
        # the pipeline catches up: a drill over in a second may otherwise meet no request), up to TRAFFIC_WAIT_S
        covered, deadline = time.monotonic() + 6, time.monotonic() + TRAFFIC_WAIT_S
        while True:
            delta = traffic_delta(before, traffic(home))
            now = time.monotonic()
            if now > deadline or (now >= covered and (delta is None or delta["answered"] > 0)):
                break
            time.sleep(0.5)
    if incident is not None:
        with IncidentLog(home.incidents) as log:
            measured = json.loads(report.read_text()) if report is not None and report.exists() else None
            extra = {
                "injected_at": injection.injected_at,
                "details": (incident.details or {})
                | {"drill": injection.drill}
                | ({"measured": measured} if measured else {}),
            }
            if delta is not None:
                extra |= {"requests_failed": delta["failed"], "requests_degraded": delta["degraded"]}
            incident = log.open_incident(incident.key, incident.kind, incident.severity, incident.summary, **extra)
    return DrillResult(injection, incident, delta, incident is not None, incident is not None and not incident.open,
                       waited)  # fmt: skip


def _find(log, injection: Injection):
    """The drill's incident: its key, or for a key ending in ``*`` the first incident of that prefix recorded after
    the drill began."""
    key = injection.incident_key
    if not key.endswith("*"):
        return log.find(key)
    after = injection.details.get("after_incident", 0)
    found = [i for i in log.list() if i.key.startswith(key[:-1]) and i.id > after]
    return found[0] if found else None
