"""The watchdog sensor: every tick it verifies the control plane's logs, puts back what was removed from the policy
store, sends each incident as an alert, and refreshes the ``incidents`` asset when the log changed.

- **The policy store** (``keel.policies.PolicyStore.verify``): a store whose newest commits were removed (the log
  ends before its keyed, published head) is an incident — gateways already refuse to follow it backwards and keep
  the last good version in force (``policy_error`` on their /readyz, which the incident quotes) — and the sensor
  restores the removed commits from the store's journal (``restore_removed``: only entries that chain onto the log
  and end at the published head). Any other verify problem (an edited or forged commit) is an incident it cannot
  undo: it stays open for a person.
- **The release ledger** (``keel.ledger.Ledger.verify``): a problem is an incident, left open for a person.
- **Incidents as alerts**: each incident once when opened (its own severity) and once when recovered (info).
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request

import dagster as dg

from assets.incidents import INCIDENTS, incidents_job
from keel.alerts import Alert
from keel.clock import SimClock
from keel.incidents import IncidentLog, requests_during
from keel.policies import PolicyStore
from keel.policies.errors import PolicyError
from resources.home import KeelHomeResource
from resources.simulated import SIM_TAG
from sensors.alerting import send_alerts
from sensors.problems import automation_problems

TAMPER = "control_plane_tamper"


def gateway_view(home) -> dict | None:
    """What the running gateway says of the policy it has in force (its /readyz), or None when none answers."""
    try:
        gateway = json.loads(home.serving.endpoints.read_text())["gateway"]
        with urllib.request.urlopen(f"http://{gateway}/readyz", timeout=2) as resp:  # noqa: S310 - 127.0.0.1
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except (ValueError, OSError):
            return None
    except (OSError, ValueError, KeyError):
        return None
    return {k: body.get(k) for k in ("policy_version", "policy_error") if k in body} or None


def check_policy_store(home, sim_now: str) -> list[str]:
    """Verify the policy store; record, act on and recover a removal. Returns the incident keys it touched."""
    if not home.policies.exists():
        return []
    touched = []
    with PolicyStore(home.policies) as store:
        result = store.verify()
        if result.ok:
            return []
        head = store.checkpoints.read_head() or {}
        key = f"tamper:policies:{head.get('seq', store.version() + 1)}"
        with IncidentLog(home.incidents) as log:
            log.open_incident(
                key, TAMPER, "critical", "the policy store lost its newest commits (or was edited)",
                located=f"control plane: {home.policies.name}: " + "; ".join(result.problems),
                detected_at=sim_now, source="watchdog_sensor",
                details={"problems": list(result.problems), "gateway": gateway_view(home), "detected_wall": time.time()},
            )  # fmt: skip
            touched.append(key)
            try:
                restored = store.restore_removed()
            except PolicyError as exc:
                log.open_incident(key, TAMPER, "critical", "the policy store lost its newest commits (or was edited)",
                                  action=f"gateways keep the last good policy; not restored: {exc}")  # fmt: skip
                return touched
            after = store.verify()
            action = "gateways refused the store and kept the last good policy in force; " + (
                f"restored version(s) {restored} from {store.checkpoints.witness.journal_name}"
                if restored
                else "nothing removed"
            )
            log.open_incident(
                key, TAMPER, "critical", "the policy store lost its newest commits (or was edited)", action=action,
                acted_at=sim_now, recovered_at=sim_now if after.ok else None,
            )  # fmt: skip
    return touched


def check_ledger(home, sim_now: str) -> None:
    from keel.ledger import Ledger

    if not home.ledger.exists():
        return
    with Ledger(home.ledger) as ledger:
        result = ledger.verify()
    if result.ok:
        return
    with IncidentLog(home.incidents) as log:
        log.open_incident(
            "tamper:ledger", TAMPER, "critical", "the release ledger does not verify",
            located=f"control plane: {home.ledger.name}: " + "; ".join(result.problems),
            detected_at=sim_now, source="watchdog_sensor", details={"problems": list(result.problems)},
        )  # fmt: skip


def incident_alerts(incidents, sent: dict[str, str]) -> list[Alert]:
    """An alert per incident opened (its severity) and per incident recovered (info), each once: ``sent`` maps an
    incident key to what was last sent for it ("open" or "recovered")."""
    out = []
    for i in incidents:
        state, last = ("open" if i.open else "recovered"), sent.get(i.key)
        if last == state:
            continue
        if last is None:
            out.append(Alert("incident", i.severity, f"incident {i.key}: {i.summary}",
                             {"located": i.located, "action": i.action, "detected_at": i.detected_at},
                             source=i.source or "keel"))  # fmt: skip
        if state == "recovered":
            out.append(Alert("incident_recovered", "info", f"incident {i.key} recovered at {i.recovered_at}",
                             {"action": i.action}, source=i.source or "keel"))  # fmt: skip
        sent[i.key] = state
    return out


@dg.sensor(
    name="watchdog_sensor",
    minimum_interval_seconds=10,
    default_status=dg.DefaultSensorStatus.RUNNING,
    jobs=[incidents_job],
    description="Verifies the policy store and the release ledger every tick (restoring policy commits removed from "
    "the store, from its journal), sends every incident as an alert by severity, and refreshes the incidents asset.",
)
def watchdog_sensor(context: dg.SensorEvaluationContext, keel_home: KeelHomeResource):
    home = keel_home.layout()
    clock = SimClock(home.clock)
    sim_now = clock.now().isoformat(timespec="seconds")
    # the refresh is tagged with the simulated instant only in a replay: before one starts (a fault announced as the
    # platform comes up) its now is the wall clock's, which no replay's timeline may show as its own
    replay = {SIM_TAG: sim_now} if clock.state() is not None else {}
    problems: list[str] = []
    try:
        check_policy_store(home, sim_now)
    except Exception as exc:  # noqa: BLE001 - a store that cannot even be opened is reported, the rest goes on
        problems.append(f"policy store {home.policies}: {exc}")
    try:
        check_ledger(home, sim_now)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"ledger {home.ledger}: {exc}")
    cursor = json.loads(context.cursor) if context.cursor else {"sent": {}, "digest": ""}
    if not home.incidents.exists():
        return dg.SkipReason("no incidents")
    with IncidentLog(home.incidents) as log:
        for i in log.list():  # what users felt, from the exposure log, once an incident is over
            if not i.open and i.requests_failed is None and i.detected_at:
                try:
                    failed, degraded = requests_during(home.serving.exposures, i.injected_at or i.detected_at,
                                                       i.recovered_at)  # fmt: skip
                except (OSError, ValueError) as exc:
                    problems.append(f"incident {i.key}: the exposure log could not be read: {exc}")
                    continue
                log.open_incident(i.key, i.kind, i.severity, i.summary, requests_failed=failed,
                                  requests_degraded=degraded)  # fmt: skip
        incidents = log.list()
    send_alerts(home, incident_alerts(incidents, cursor["sent"]), problems)
    for p in problems:
        context.log.error(p)
    digest = json.dumps([[i.key, i.recovered_at, i.requests_failed, i.requests_degraded, i.injected_at]
                         for i in incidents])  # fmt: skip
    requests = []
    if digest != cursor["digest"]:
        requests.append(
            dg.RunRequest(
                run_key=f"incidents:{hashlib.sha256(digest.encode()).hexdigest()[:16]}",
                job_name=incidents_job.name,
                tags=replay,
            )
        )
        cursor["digest"] = digest
    return dg.SensorResult(
        run_requests=requests,
        cursor=json.dumps(cursor),
        asset_events=automation_problems(INCIDENTS, "watchdog_sensor", problems),
    )
