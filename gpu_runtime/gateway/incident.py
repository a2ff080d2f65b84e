"""Overload as an incident: when the gateway has been shedding or protecting its highest tier for a while it records
an ``overload`` incident (keel/incidents.py) with its timeline — detected, acted (the shedding is the action),
recovered — and what it saw; the watchdog sensor routes it as an alert like every incident (sensors/watchdog.py).

``OverloadWatch.update`` is the decision, a pure function of one second's evidence: overloaded while requests were
shed or refused for their deadline, local timeouts happened, the lower tiers were held below their share, or the CPU
was under pressure with requests in flight. ``OPEN_AFTER`` overloaded seconds in a row open an incident; after
``RECOVER_AFTER`` quiet seconds in a row it is recovered. The gateway's watcher feeds it from its counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

OPEN_AFTER = 2
RECOVER_AFTER = 5
PRESSURE = 0.5
COUNTED = ("keel_gateway_shed_total", "keel_gateway_local_timeouts_total")


@dataclass(frozen=True)
class Evidence:
    """One second of the gateway: what it refused and under what conditions."""

    shed: int = 0  # requests shed (admission, at the door) in the second
    deadline_exceeded: int = 0
    local_timeouts: int = 0
    lower_share: float = 1.0
    cpu_pressure: float = 0.0
    in_flight: int = 0

    def reasons(self) -> list[str]:
        out = []
        if self.shed:
            out.append(f"{self.shed} requests shed")
        if self.deadline_exceeded:
            out.append(f"{self.deadline_exceeded} past their deadline")
        if self.local_timeouts:
            out.append(f"{self.local_timeouts} Triton calls timed out on local overload")
        if self.lower_share < 1.0:
            out.append(f"the lower tiers held at {self.lower_share:.0%} of their share to protect the highest")
        if self.cpu_pressure >= PRESSURE and self.in_flight:
            out.append(f"CPU pressure {self.cpu_pressure:.0%}")
        return out


@dataclass(frozen=True)
class Transition:
    event: str  # "opened" | "recovered"
    reasons: tuple[str, ...]
    peak: dict[str, Any]


@dataclass
class OverloadWatch:
    overloaded_for: int = 0
    quiet_for: int = 0
    open: bool = False
    peak: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def update(self, e: Evidence) -> Transition | None:
        reasons = e.reasons()
        if reasons:
            self.overloaded_for, self.quiet_for = self.overloaded_for + 1, 0
            self.peak = {
                "shed_per_s": max(self.peak.get("shed_per_s", 0), e.shed),
                "deadline_exceeded_per_s": max(self.peak.get("deadline_exceeded_per_s", 0), e.deadline_exceeded),
                "local_timeouts_per_s": max(self.peak.get("local_timeouts_per_s", 0), e.local_timeouts),
                "lowest_lower_share": min(self.peak.get("lowest_lower_share", 1.0), e.lower_share),
                "cpu_pressure": max(self.peak.get("cpu_pressure", 0.0), e.cpu_pressure),
            }
            self.reasons = sorted(set(self.reasons) | {r.split(" ", 1)[1] if r[0].isdigit() else r for r in reasons})
            if not self.open and self.overloaded_for >= OPEN_AFTER:
                self.open = True
                return Transition("opened", tuple(reasons), dict(self.peak))
            return None
        self.quiet_for, self.overloaded_for = self.quiet_for + 1, 0
        if self.open and self.quiet_for >= RECOVER_AFTER:
            self.open = False
            out = Transition("recovered", tuple(self.reasons), dict(self.peak))
            self.peak, self.reasons = {}, []
            return out
        if not self.open:
            self.peak, self.reasons = {}, []
        return None


class OverloadRecorder:
    """The gateway's side: each second's evidence from its metrics, each transition into the incident log."""

    def __init__(self, incidents: Path, clock_path: Path | None, where: str):
        self.incidents, self.clock_path, self.where = incidents, clock_path, where
        self.watch = OverloadWatch()
        self.key: str | None = None
        self._last: dict[str, float] = {}

    def evidence(self, metrics: Any, lower_share: float, cpu_pressure: float, in_flight: int) -> Evidence:
        totals = {name: 0.0 for name in (*COUNTED, "deadline_exceeded")}
        for name in COUNTED:
            totals[name] = sum(metrics.counters.get(name, {}).values())
        totals["deadline_exceeded"] = sum(
            v for k, v in metrics.counters.get("keel_gateway_errors_total", {}).items()
            if dict(k).get("code") == "deadline_exceeded"
        )  # fmt: skip
        delta = {k: int(v - self._last.get(k, v)) for k, v in totals.items()}
        self._last = totals
        return Evidence(delta["keel_gateway_shed_total"], delta["deadline_exceeded"],
                        delta["keel_gateway_local_timeouts_total"], lower_share, cpu_pressure, in_flight)  # fmt: skip

    def record(self, t: Transition) -> None:
        from keel.incidents import IncidentLog

        now = self._now()
        with IncidentLog(self.incidents) as log:
            if t.event == "opened":
                self.key = f"overload:{self.where}:{datetime.now(UTC):%Y%m%dT%H%M%S}"
                log.open_incident(
                    self.key, "overload", "warning", f"the gateway ({self.where}) is overloaded: refusing fast, "
                    "the highest tier served first", located=f"local overload: {'; '.join(t.reasons)}",
                    detected_at=now, acted_at=now, action="shed the lower tiers at the door (structured 503 with "
                    "Retry-After), deadlines refused fast, no breaker strike for local timeouts",
                    source="gateway", details={"peak": t.peak},
                )  # fmt: skip
            elif self.key is not None:
                log.open_incident(self.key, "overload", "warning", f"the gateway ({self.where}) was overloaded",
                                  recovered_at=now, details={"peak": t.peak, "reasons": list(t.reasons)})  # fmt: skip
                self.key = None

    def _now(self) -> str:
        if self.clock_path is not None and self.clock_path.exists():
            from keel.clock import SimClock

            return SimClock(self.clock_path).now().isoformat(timespec="seconds")
        return datetime.now(UTC).isoformat(timespec="seconds")
