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
| ``overload`` | a starved machine (a busy process per core), then the lowest tier flooded at 10× what the runtime answers it, over 64 tenants (gpu_runtime/overload_drill.py) | the gateway: lower tiers shed at the door, deadlines refused fast, the highest tier served first; it records the overload incident and recovers it once the fault is gone |

The corruptions are pure functions (tested on their own); ``inject`` applies them to a KEEL_HOME.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from datetime import date
from pathlib import Path
from typing import Any

from keel.chaos_watch import DrillResult, Injection, traffic, watch
from keel.errors import KeelError

DRILLS = ("unit-change", "schema-break", "bad-challenger", "runtime-crash", "coarse-fallback", "control-plane-tamper",
          "overload")  # fmt: skip
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
    if drill == "overload":
        return _overload(home, now())
    if drill == "control-plane-tamper":
        if not home.policies.exists():
            raise DrillError(f"no policy store at {home.policies}")
        version = remove_newest_commit(home.policies)
        return Injection(drill, f"tamper:policies:{version}", f"policy version {version} deleted from {home.policies}",
                         now(), {"version": version})  # fmt: skip
    raise DrillError(f"no drill {drill!r}; drills: {', '.join(DRILLS)}")


def _overload(home, injected_at: str) -> Injection:
    """Start the overload fault (gpu_runtime/overload_drill.py, a process of its own: it starves the machine, floods
    the lowest tier and measures the highest tier's answers); the gateway names its incident ``overload:<where>:<time>``,
    so the drill watches for the first one opened after it began."""
    import subprocess
    import sys

    from keel.incidents import IncidentLog

    if not home.serving.endpoints.exists():
        raise DrillError(f"no running model runtime ({home.serving.endpoints}); is `keel serve` up?")
    with IncidentLog(home.incidents) as log:
        after = max((i.id for i in log.list()), default=0)
    report = home.serving.root / "drills" / f"overload-{time.strftime('%Y%m%dT%H%M%S')}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"KEEL_HOME": str(home.root)}
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runtime.overload_drill", "--out", str(report)], env=env,
                            stdout=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    return Injection("overload", "overload:*", "a busy process per core, then the lowest tier flooded at 10x what "
                     "the runtime answers it", injected_at, {"pid": proc.pid, "report": str(report),
                                                              "after_incident": after})  # fmt: skip


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


def run_drill(drill: str, home, uc, timeout_s: float = 300.0, progress=None) -> DrillResult:
    """Inject ``drill`` on use case ``uc`` and watch its incident until it is recovered or ``timeout_s`` passes."""
    before = traffic(home)
    injection = inject(drill, home, uc)
    if progress:
        progress(
            f"injected: {injection.what} (simulated {injection.injected_at}); watching incident {injection.incident_key}"
        )
    return watch(home, injection, timeout_s, before, progress)
