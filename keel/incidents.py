"""Incidents: each fault the platform detects (and, with the drills, each fault injected) as one record with its
timeline — injected, detected, located (the root cause as named), acted on, recovered — and what users felt
(requests failed and degraded during it).

``IncidentLog`` keeps them in ``$KEEL_HOME/incidents.sqlite`` (WAL, synchronous=FULL, like the other control-plane
logs), or in the control plane's Postgres schema (``$KEEL_CONTROL_PLANE``, keel.sqldb). ``open_incident`` is idempotent by ``key`` (what the fault is: a canary and its version, a delivery): a
duplicate sensor tick or a restarted daemon updates the same record instead of opening a second one. Times are ISO
8601 strings on the shared clock (simulated in the live year).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from keel.sqldb import Database, Location, location_of
from keel.storage import Closing

TIMELINE = ("injected_at", "detected_at", "acted_at", "recovered_at")


@dataclass(frozen=True)
class Incident:
    id: int
    key: str  # what the fault is, uniquely: "canary:my-model.loop-v6", "delivery:weather:2013-07-14", …
    kind: str
    severity: str
    summary: str
    located: str | None = None  # the root cause as the platform named it
    action: str | None = None
    injected_at: str | None = None  # drills only
    detected_at: str | None = None
    acted_at: str | None = None
    recovered_at: str | None = None
    requests_failed: int | None = None
    requests_degraded: int | None = None
    source: str | None = None  # the sensor or drill that recorded it
    details: dict[str, Any] | None = None

    @property
    def open(self) -> bool:
        return self.recovered_at is None


COLUMNS = [f.name for f in fields(Incident)]


COLUMNS_SQL = (
    "key TEXT UNIQUE NOT NULL, kind TEXT NOT NULL, severity TEXT NOT NULL, summary TEXT NOT NULL, located TEXT, "
    "action TEXT, injected_at TEXT, detected_at TEXT, acted_at TEXT, recovered_at TEXT, requests_failed BIGINT, "
    "requests_degraded BIGINT, source TEXT, details TEXT"
)


class IncidentLog(Closing):
    def __init__(self, location: str | Path | Location):
        self.location = location_of(location)
        self.path = self.location
        self._db = Database.open(self.location)
        self._db.script(
            sqlite=f"CREATE TABLE IF NOT EXISTS incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, {COLUMNS_SQL})",
            postgres=f"CREATE TABLE IF NOT EXISTS incidents (id BIGSERIAL PRIMARY KEY, {COLUMNS_SQL})",
        )

    def close(self) -> None:
        self._db.close()

    def open_incident(self, key: str, kind: str, severity: str, summary: str, **fields_: Any) -> Incident:
        """Record the incident ``key`` (or update it: fields given now replace those recorded; none is cleared)."""
        unknown = set(fields_) - set(COLUMNS)
        if unknown:
            raise ValueError(f"incident fields {sorted(unknown)} are not known: {', '.join(COLUMNS)}")
        values = {"kind": kind, "severity": severity, "summary": summary} | {
            k: (json.dumps(v, default=str) if k == "details" else v) for k, v in fields_.items() if v is not None
        }
        with self._db.write(lock="incidents"):
            row = self._db.execute("SELECT id FROM incidents WHERE key = ?", (key,)).fetchone()
            if row is None:
                names = ["key", *values]
                self._db.execute(
                    f"INSERT INTO incidents ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                    [key, *values.values()],
                )
            else:
                sets = ", ".join(f"{k} = ?" for k in values)
                self._db.execute(f"UPDATE incidents SET {sets} WHERE key = ?", [*values.values(), key])
        return self.get(key)

    def resolve(self, key: str, reason: str, author: str, at: str) -> Incident:
        """Close the open incident ``key`` by hand — a fault waived or fixed outside the platform (a held-back delivery
        the upstream will not send again) — at ``at``, saying who and why. KeyError: no such incident; ValueError:
        already recovered, or no reason given."""
        incident = self.get(key)
        if not incident.open:
            raise ValueError(f"incident {key} was recovered at {incident.recovered_at}: nothing to resolve")
        if not reason.strip():
            raise ValueError("a resolution needs a reason (--reason)")
        action = f"{incident.action + '; ' if incident.action else ''}resolved by {author}: {reason.strip()}"
        return self.open_incident(key, incident.kind, incident.severity, incident.summary, recovered_at=at,
                                  action=action)  # fmt: skip

    def get(self, key: str) -> Incident:
        row = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM incidents WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(f"no incident {key!r}")
        return _incident(row)

    def find(self, key: str) -> Incident | None:
        try:
            return self.get(key)
        except KeyError:
            return None

    def open_incidents(self, kind: str | None = None) -> list[Incident]:
        """The incidents not recovered yet (of ``kind`` when given), oldest first."""
        return [i for i in self.list() if i.open and (kind is None or i.kind == kind)]

    def list(self) -> list[Incident]:
        rows = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM incidents ORDER BY id").fetchall()
        return [_incident(r) for r in rows]


PLATFORM = "platform"  # an incident of no one use case: the control plane, the model runtime


def usecase_of(incident: Incident, names: Mapping[str, str]) -> str:
    """The use case ``incident`` belongs to. ``names`` maps each use case's name and its model's name to the use case
    (built from the installed use cases by the caller: keel names none). Looked for in its details' ``usecase``, its
    source (``<use case>_landing_sensor``), then its key's parts (``delivery:<use case>:…``, ``canary:<model>.…``,
    ``degraded_serving:<model>:…``); ``PLATFORM`` when none names one."""
    details = incident.details or {}
    if details.get("usecase") in names:
        return names[details["usecase"]]
    source = incident.source or ""
    for name in sorted(names, key=len, reverse=True):
        if source.startswith(f"{name}_"):
            return names[name]
    for part in incident.key.split(":"):
        for candidate in (part, part.split(".", 1)[0]):
            if candidate in names:
                return names[candidate]
    return PLATFORM


def _incident(row) -> Incident:
    data = dict(zip(COLUMNS, row, strict=True))
    if data["details"]:
        data["details"] = json.loads(data["details"])
    return Incident(**data)


def locate_delivery(graph, verdict, key_prefix: str | None = None) -> str:
    """The root cause of a held-back delivery as a person reads it, through the lineage graph (``keel.lineage``):
    the delivery, the columns and contract rule that broke, and the feature columns downstream that it would have
    fed (``impact`` of each broken raw column) — e.g. ``delivery weather/2013-04-05 → raw_weather.temp (contract
    weather v1: …) → feeds features.temp``. ``key_prefix``: the use case the delivery belongs to (its raw asset is
    ``<prefix>/raw_<table>``)."""
    raw = f"{key_prefix}/raw_{verdict.table}" if key_prefix else f"raw_{verdict.table}"
    feeds: list[str] = []
    for column in verdict.columns:
        try:
            impact = graph.impact(f"{raw}.{column}")
        except Exception:  # noqa: BLE001 - a column the graph does not publish: name it without its consumers
            continue
        for item in impact.assets:
            if item.role == "feature" and item.columns != ("*",):
                feeds += [f"{item.key}.{c}" for c in item.columns if f"{item.key}.{c}" not in feeds]
    cols = ", ".join(f"{raw}.{c}" for c in verdict.columns) or raw
    what = verdict.summary().split(": ", 1)[-1]
    text = f"delivery {verdict.table}/{verdict.day} → {cols} (contract {verdict.contract} v{verdict.contract_version}: {what})"
    return text + (f" → feeds {', '.join(feeds)}" if feeds else "")


def requests_during(exposures_dir: Path, start: str, end: str) -> tuple[int, int]:
    """What the gateway's answers were between two instants of the shared clock (the exposure log is stamped on it):
    (failed: answered with a status other than 200, degraded: answered 200 with a degraded flag)."""
    from datetime import datetime

    from keel.exposure_log import scan_exposures

    t0, t1 = datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp()
    failed = degraded = 0
    for r in scan_exposures(exposures_dir, since=t0).records:
        ts = r.get("ts")
        if not isinstance(ts, int | float) or not t0 <= ts <= t1:
            continue
        if r.get("status") != 200:
            failed += 1
        elif r.get("degraded"):
            degraded += 1
    return failed, degraded
