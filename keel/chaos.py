"""Chaos drills: a real fault injected into the running platform, which must then detect, locate and undo it by
itself while the drill only watches (``keel chaos run <drill>``; the weekly schedule ``weekly_chaos_drill``).

Each drill injects one fault and names the incident the platform is expected to open for it (its key). Then it
watches the incident log: the platform records detection, the root cause it located, its action and the recovery;
the drill adds ``injected_at`` and what users felt — the live traffic's answers while the fault lasted
(``$KEEL_HOME/serving/live_traffic/``, when a live replay sends traffic). Nothing in a drill repairs anything.

| drill | fault | who acts |
|---|---|---|
| ``unit-change`` | the next day of weather arrives with temperatures in °C | landing sensor: the delivery gate holds the day back; the upstream's next delivery of it is admitted |
| ``schema-break`` | the next day of the use case's ``drills.schema_break`` table arrives with a column renamed and one missing | landing sensor, as for unit-change |
| ``bad-challenger`` | a challenger whose scores are inverted (1 − p) enters a canary | canary sensor: rolled back on realized labels |
| ``runtime-crash`` | tritonserver is killed (SIGKILL) under traffic | the runtime's supervisor restarts it and reloads the routed versions |
| ``coarse-fallback`` | tritonserver hangs (SIGSTOP: alive, answering nothing) under traffic | the gateway answers from each model's coarse model (breakers open, then runtime down); the supervisor sees the liveness check fail, restarts Triton, and the models answer again |
| ``control-plane-tamper`` | the newest policy commit is deleted from the store file | gateways refuse the store; watchdog_sensor restores the commit from the journal |

The corruptions are pure functions (tested on their own); ``inject`` applies them to a KEEL_HOME.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from keel.errors import KeelError

DRILLS = ("unit-change", "schema-break", "bad-challenger", "runtime-crash", "coarse-fallback", "control-plane-tamper")
DRILL_AUTHOR = "chaos-drill"
# The drill's canary: bigger first steps than the loop's (the fault must meet enough traffic to be judged), labels
# enough for the quality test, and two simulated days per step — an outcome lands the day after its entity was scored, so
# a step must last past the first labels or it would advance on latency and errors alone.
DRILL_CANARY: dict[str, Any] = {
    "steps": [10, 50, 100],
    "paired": True,  # quality judged on the same requests (the challenger scores the champion's in shadow)
    "interval_s": 2 * 86400.0,
    "min_samples": 20,
    "min_labelled": 30,
    "max_log_loss_increase": 0.02,
    # The inverted challenger is the champion's trees with the output flipped: the same work per request. Its p99
    # over a step's first ~20 requests is their slowest one, and on a loaded host that can reach 1.8x the
    # champion's p99 over ten times as many (seen while a second test suite ran). The drill is about quality, so
    # its latency guard only fires on a gross difference; the 1.2x default is tested in tests/policy/test_canary.py.
    "latency_ratio": 3.0,
    "progress_deadline_s": 20 * 86400.0,
}


class DrillError(KeelError):
    """A drill cannot be injected here (no platform running, nothing to tamper with, a canary already running)."""


# -- the faults, as pure functions ------------------------------------------------------------------------------


def invert_model(text: str) -> str:
    """A LightGBM binary model whose scores are 1 − p: every leaf value negated (the raw score flips sign, the
    sigmoid of it is the complement). Everything else — features, trees, thresholds — is the same."""
    from keel.loop.recalibrate import affine_model_text

    try:
        return affine_model_text(text, -1.0, 0.0)
    except ValueError as exc:
        raise DrillError(str(exc)) from None


def remove_newest_commit(db_path) -> int:
    """What someone with write access to the database can do: take the append-only triggers away and delete the
    newest policy commit (its policy rows and its checkpoint too). Returns the version removed. ``db_path``: the
    SQLite file, or the Postgres schema of a control plane there (the triggers disabled and enabled again inside
    the one transaction, as its owner can)."""
    from keel.sqldb import PgLocation

    if isinstance(db_path, PgLocation):
        return _remove_newest_commit_postgres(db_path)
    db = sqlite3.connect(db_path, timeout=30, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT MAX(version) FROM commits").fetchone()
        if not row or row[0] is None:
            db.execute("ROLLBACK")
            raise DrillError(f"{db_path}: the policy store has no commit to remove")
        version = int(row[0])
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            db.execute(f'DROP TRIGGER "{name}"')
        db.execute("DELETE FROM policy_versions WHERE version = ?", (version,))
        db.execute("DELETE FROM commits WHERE version = ?", (version,))
        db.execute("DELETE FROM policy_checkpoints WHERE seq = ?", (version,))
        db.execute("COMMIT")
        return version
    finally:
        db.close()


def _remove_newest_commit_postgres(location) -> int:
    from keel.sqldb import Database

    db = Database.open(location, create=False)
    try:
        with db.write(lock="commits"):
            row = db.execute("SELECT MAX(version) FROM commits").fetchone()
            if not row or row[0] is None:
                raise DrillError(f"{location.shown()}: the policy store has no commit to remove")
            version = int(row[0])
            tables = ("commits", "policy_versions")
            for table in tables:
                db.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
            db.execute("DELETE FROM policy_versions WHERE version = ?", (version,))
            db.execute("DELETE FROM commits WHERE version = ?", (version,))
            db.execute("DELETE FROM policy_checkpoints WHERE seq = ?", (version,))
            for table in tables:
                db.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
        return version
    finally:
        db.close()


# -- injecting into a KEEL_HOME ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Injection:
    drill: str
    incident_key: str  # the incident the platform is expected to open
    what: str
    injected_at: str  # on the shared clock
    details: dict[str, Any] = field(default_factory=dict)


def _deliver_early(home, uc, table: str, corrupt) -> tuple[date, Path]:
    from keel.clock import SimClock
    from keel.data.delivery import next_due_day
    from keel.data.landing import LandingZone
    from keel.storage import write_parquet_atomic

    if SimClock(home.clock).state() is None:
        raise DrillError(
            "this drill needs a live replay (a simulated clock under KEEL_HOME): deliveries come from it"
        )
    zone = LandingZone(home.landing, uc)
    day = next_due_day(zone, table, SimClock(home.clock, uc.name).now())
    path = zone.path(table, day)
    write_parquet_atomic(corrupt(zone.day_rows(table, day)), path)
    return day, path


def inject(drill: str, home, uc) -> Injection:
    """Inject ``drill``'s fault into the platform at ``home`` (a keel.home.KeelHome), on use case ``uc`` (a
    keel.usecase.UseCase: its deliveries, its model); ``details.injected_wall`` is the wall-clock instant (epoch
    seconds), to compare with the sensors' ticks."""
    injection = _inject(drill, home, uc)
    return Injection(injection.drill, injection.incident_key, injection.what, injection.injected_at,
                     injection.details | {"injected_wall": time.time()})  # fmt: skip


def _inject(drill: str, home, uc) -> Injection:
    from keel.clock import SimClock

    now = lambda: SimClock(home.clock, uc.name).now().isoformat(timespec="seconds")  # noqa: E731
    if drill in ("unit-change", "schema-break"):
        target = uc.drills.unit_change if drill == "unit-change" else uc.drills.schema_break
        if target is None:
            raise DrillError(f"the {uc.name} use case declares no {drill} target (UseCase.drills)")
        day, path = _deliver_early(home, uc, target.table, target.apply)
        return Injection(drill, f"delivery:{uc.name}:{target.table}:{day}", f"{target.table} of {day} delivered with "
                         f"{target.note}", now(), {"file": str(path)})  # fmt: skip
    if drill == "bad-challenger":
        name, version = _bad_challenger(home, uc.model.name)
        return Injection(drill, f"canary:{name}", f"inverted challenger v{version} entered canary {name}", now(),
                         {"canary": name, "challenger_version": version})  # fmt: skip
    if drill in ("runtime-crash", "coarse-fallback"):
        sig, how = (signal.SIGKILL, "killed with SIGKILL") if drill == "runtime-crash" else (
            signal.SIGSTOP, "hung with SIGSTOP (alive, answering nothing)")  # fmt: skip
        pid_file = home.serving.root / "triton" / "tritonserver.pid"
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, sig)
        except (FileNotFoundError, ValueError, ProcessLookupError) as exc:
            raise DrillError(f"no running tritonserver to signal ({pid_file}: {exc}); is `keel serve` up?") from exc
        return Injection(drill, f"runtime:{pid}", f"tritonserver (pid {pid}) {how}", now(), {"pid": pid})
    if drill == "control-plane-tamper":
        if not home.policies.exists():
            raise DrillError(f"no policy store at {home.policies}")
        version = remove_newest_commit(home.policies)
        return Injection(drill, f"tamper:policies:{version}", f"policy version {version} deleted from {home.policies}",
                         now(), {"version": version})  # fmt: skip
    raise DrillError(f"no drill {drill!r}; drills: {', '.join(DRILLS)}")


def _bad_challenger(home, model: str) -> tuple[str, int]:
    return plant_challenger(home, model, invert_model, "drill", DRILL_AUTHOR, "chaos drill bad-challenger: v{challenger} is "
                            "v{champion} with inverted scores", {"drill": "bad-challenger"})  # fmt: skip


def twin_model(text: str) -> str:
    """The same trees under another recorded seed: byte for byte another model (another sha256, another registry
    version), score for score the same one — a challenger known to be exactly as good as the champion."""
    out, n = re.subn(r"^\[seed: (-?\d+)\]$", lambda m: f"[seed: {int(m.group(1)) + 1}]", text, flags=re.MULTILINE)
    if n != 1:
        raise DrillError("not a LightGBM text model with a recorded seed")
    return out


def plant_challenger(
    home,
    model: str,
    transform,
    tag: str,
    author: str,
    reason: str,
    meta: dict[str, Any],
    canary: dict[str, Any] | None = None,
) -> tuple[str, int]:
    """A challenger of ``model`` made from its champion's model text by ``transform``, registered and put into a canary named
    ``<model>.<tag>-v<version>`` (body ``canary``, default DRILL_CANARY). Refused while a canary of the model is
    unfinished; the commit is made for the store's next version only, so a canary the loop starts meanwhile is never
    disturbed (the caller may try again). ``reason`` may name ``{challenger}`` and ``{champion}``."""
    from keel.policies import PolicyError, PolicyStore
    from keel.registry import ModelRegistry

    with ModelRegistry(home.registry) as reg, PolicyStore(home.policies) as store:
        seen = store.version()
        for name, p in store.state(seen).items():
            status = (p.body.get("state") or {}).get("status", "not started")
            if p.type == "canary" and p.body.get("model") == model and status not in ("promoted", "rolled_back"):
                raise DrillError(f"canary {name} is running: the drill would disturb it; run it when it has finished")
        champion = reg.alias(model, "champion")
        if champion is None:
            raise DrillError(f"{model} has no champion to make a challenger from")
        base = dict(reg.get(model, champion).metadata)
        planted = reg.register(model, transform(reg.load(champion)), base | meta | {"planted_from": champion})
        version = reg.version(model, planted.sha256)
        champion_version = reg.version(model, champion)
        name = f"{model}.{tag}-v{version}"
        body = {"model": model, "champion_version": champion_version, "challenger_version": version,
                **(canary or DRILL_CANARY)}  # fmt: skip
        try:
            store.apply({name: ("canary", body)}, author=author, expected_version=seen + 1,
                        reason=reason.format(challenger=version, champion=champion_version))  # fmt: skip
        except PolicyError as exc:  # someone committed since the look above (the loop may have started a canary)
            raise DrillError(
                f"the policy store moved on while the challenger was planted ({exc}); try again"
            ) from exc
    return name, version


# -- watching ---------------------------------------------------------------------------------------------------


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
    while time.monotonic() - start < timeout_s:
        with IncidentLog(home.incidents) as log:
            incident = log.find(injection.incident_key)
        if incident is not None:
            for step in ("detected_at", "acted_at", "recovered_at"):
                if getattr(incident, step) and step not in said and progress:
                    said.add(step)
                    progress(f"{step.split('_')[0]} at {getattr(incident, step)}")
            if not incident.open:
                break
        time.sleep(0.5)
    waited = time.monotonic() - start
    if incident is not None and not incident.open:
        time.sleep(6)  # the traffic's totals are rewritten every 5 s: let them cover the recovery
    delta = traffic_delta(before, traffic(home))
    if incident is not None:
        with IncidentLog(home.incidents) as log:
            extra = {
                "injected_at": injection.injected_at,
                "details": (incident.details or {}) | {"drill": injection.drill},
            }
            if delta is not None:
                extra |= {"requests_failed": delta["failed"], "requests_degraded": delta["degraded"]}
            incident = log.open_incident(incident.key, incident.kind, incident.severity, incident.summary, **extra)
    return DrillResult(injection, incident, delta, incident is not None, incident is not None and not incident.open,
                       waited)  # fmt: skip


def run_drill(drill: str, home, uc, timeout_s: float = 300.0, progress=None) -> DrillResult:
    """Inject ``drill`` on use case ``uc`` and watch its incident until it is recovered or ``timeout_s`` passes."""
    before = traffic(home)
    injection = inject(drill, home, uc)
    if progress:
        progress(
            f"injected: {injection.what} (simulated {injection.injected_at}); watching incident {injection.incident_key}"
        )
    return watch(home, injection, timeout_s, before, progress)
