"""The landing sensor: in a live replay, new days in the landing zone rebuild their month; a month whose flights have
all landed gets its drift report once that rebuild has materialized its features.

The decision is ``keel.loop.arrivals`` (pure); this sensor reads the landing zone and the instance, and turns the
decision into run requests of the use case's defined jobs (``<use case>_monthly``, ``<use case>_drift``); one sensor
per use case, ``<use case>_landing_sensor`` (``build_landing_sensor``). Run keys name exactly what landed, so a
restarted daemon or a replayed cursor never builds the same delivery twice. While a rebuild of the use case is queued
or running, new days wait and go into the next run together: on a busy machine (two use cases replayed at once)
deliveries coalesce instead of queueing up. Outside a live replay (no simulated
clock under KEEL_HOME) it skips: the set-up's jobs build 2013 as a backfill.
"""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path

import dagster as dg

from assets.jobs import PRIORITY_JUDGE, UseCaseJobs
from assets.usecase import wiring
from keel.alerts import Alert
from keel.clock import SimClock
from keel.data.delivery import DeliveryGate, DeliveryVerdict, held_back
from keel.data.landing import LandingZone
from keel.incidents import IncidentLog, locate_delivery
from keel.lineage import LineageGraph
from keel.loop.arrivals import Landed, arrivals, days_in
from keel.usecase import UseCase, plays
from resources.home import KeelHomeResource
from sensors.alerting import send_alerts
from sensors.deliveries import DELIVERY_TAG, built_from
from sensors.drift import IN_PROGRESS
from sensors.stepping import interval_s, stepped_tick


def build_landing_sensor(uc: UseCase, jobs: UseCaseJobs) -> dg.SensorDefinition:
    """``<use case>_landing_sensor``: the use case's landed days → monthly rebuilds, complete months → drift."""
    w = wiring(uc)
    tables = " and ".join(src.name for src in uc.landed)

    @dg.sensor(
        name=f"{uc.name}_landing_sensor",
        minimum_interval_seconds=interval_s(),
        default_status=dg.DefaultSensorStatus.RUNNING if plays(uc.name) else dg.DefaultSensorStatus.STOPPED,
        jobs=[jobs.monthly, jobs.drift],
        description=f"Live replay of {uc.title}: new days of {tables} in the landing zone rebuild their month "
        "(validation, features, online store); a complete month gets its drift report. Skips outside a live replay.",
    )
    def _sensor(context: dg.SensorEvaluationContext, keel_home: KeelHomeResource):
        return stepped_tick(context, f"{uc.name}_landing_sensor", uc.name, keel_home, lambda: landing_tick(
            context, keel_home, uc, jobs, features=w.key(uc.feature_table), reference=w.key("drift_reference")
        ))  # fmt: skip

    return _sensor


def landing_tick(context, keel_home, uc: UseCase, jobs: UseCaseJobs, features: dg.AssetKey, reference: dg.AssetKey):
    home = keel_home.layout()
    clock = SimClock(home.clock, uc.name)
    state = clock.state()
    if state is None:
        return dg.SkipReason("no live replay (no simulated clock under KEEL_HOME)")
    zone = LandingZone(home.landing, uc)
    sim_now = clock.now().isoformat(timespec="seconds")
    # Every new day file passes the delivery gate first (also while paused: a drill or an upstream can deliver any
    # time): a systematically broken day is held back before anything reads it.
    problems: list[str] = []
    gate = DeliveryGate(zone)
    gate.check_new()
    report_deliveries(context, home, uc, gate, sim_now, problems)
    for p in problems:
        context.log.error(p)
    if not state.running:  # the set-up builds the history while it is paused; Ctrl-C pauses a replay
        return dg.SkipReason(
            f"the live replay is paused at simulated {state.sim_anchor.isoformat(timespec='seconds')}"
        )
    cursor = json.loads(context.cursor) if context.cursor else {"seen": {}, "drift": []}
    seen = {m: Landed(tuple(v)) for m, v in cursor["seen"].items()}
    landed = zone.landed_by_month()
    requests = []
    # Deliveries coalesce: while a rebuild of this use case is queued or running, new days wait for the next tick
    # and go in one run together — a busy machine builds fewer, larger deliveries instead of a growing queue.
    building = context.instance.get_runs(
        filters=dg.RunsFilter(job_name=jobs.monthly.name, statuses=IN_PROGRESS), limit=1
    )
    batch = state.batch_days if state.stepped else 1
    for refresh in [] if building else arrivals(landed, seen, batch):
        if built_from(context.instance, features, refresh.month) == refresh.run_key:
            seen[refresh.month] = refresh.landed  # built already (the set-up's history runs): not twice
            continue
        requests.append(
            dg.RunRequest(
                job_name=jobs.monthly.name,
                partition_key=refresh.month,
                run_key=refresh.run_key,
                tags={"keel/trigger": "landing", "keel/sim_now": sim_now, DELIVERY_TAG: refresh.run_key},
            )
        )
        seen[refresh.month] = refresh.landed
    # Drift reports for complete months whose features the complete delivery has built (not before: the report
    # would judge a partial month), once the drift reference exists (the first model's job builds it).
    drift_done = set(cursor["drift"])
    has_reference = context.instance.get_latest_materialization_event(reference) is not None
    for month, now in sorted(landed.items()):
        complete_key = f"landing:{month}:{'-'.join(map(str, now.days))}"
        complete = now.outcome_days == days_in(month) and month not in drift_done
        if complete and has_reference and built_from(context.instance, features, month) == complete_key:
            requests.append(
                dg.RunRequest(
                    job_name=jobs.drift.name,
                    partition_key=month,
                    run_key=f"drift:{month}",
                    tags={"keel/trigger": "landing", "keel/sim_now": sim_now, **PRIORITY_JUDGE},
                )
            )
            drift_done.add(month)
    new_cursor = json.dumps({"seen": {m: list(v.days) for m, v in seen.items()}, "drift": sorted(drift_done)})
    if not requests:  # the cursor moves only with requests: a tick with nothing new loses nothing
        if new_cursor != context.cursor and seen:
            return dg.SensorResult(run_requests=[], cursor=new_cursor)  # history built by the set-up: noted
        if building:
            return dg.SkipReason(
                f"a delivery of {uc.name} is being built: new days wait for it (simulated {sim_now})"
            )
        return dg.SkipReason(f"nothing new in the landing zone at simulated {sim_now}")
    return dg.SensorResult(run_requests=requests, cursor=new_cursor)


HELD_BACK = "delivery_held_back"


def report_deliveries(context, home, uc: UseCase, gate: DeliveryGate, sim_now: str, problems) -> None:
    """Every held-back delivery (by this tick's gate, or by a run's raw asset that met it first) becomes an incident,
    located through the lineage graph, and a contract-breach alert by the severity of what broke; an incident whose
    day has since been admitted (the upstream delivered it again, whole) is recovered. (watchdog_sensor sends the
    incident itself as an alert, opened and recovered.)"""
    alerts = []
    graph = None
    with IncidentLog(home.incidents) as log:
        for record in held_back(gate.root):
            key = f"delivery:{uc.name}:{record['table']}:{Path(record['held_at']).stem}"  # held twice: <day>.2
            if log.find(key) is not None:
                continue
            v = DeliveryVerdict.from_dict(record)
            if graph is None and context.repository_def is not None:
                graph = LineageGraph.from_definitions(context.repository_def)
            severity = (
                "critical" if v.missing_columns or any(b.severity == "critical" for b in v.breaches) else "warning"
            )
            located = locate_delivery(graph, v, uc.name) if graph is not None else v.summary()
            log.open_incident(
                key,
                HELD_BACK,
                severity,
                f"{v.table} delivery of {v.day} held back: {v.summary().split(': ', 1)[-1]}",
                located=located,
                action=f"held back before its month read it ({v.rows} rows kept whole in landing/_quarantine/"
                f"{v.table}); the month is built without it, serving continues",
                detected_at=sim_now,
                acted_at=sim_now,
                source=f"{uc.name}_landing_sensor",
                details=record | {"detected_wall": time.time()},
            )
            alerts.append(
                Alert("contract_breach", severity, f"{v.table} delivery of {v.day} held back",
                      {"located": located, "incident": key, "simulated": sim_now}, source=f"{uc.name}_landing_sensor")
            )  # fmt: skip
            context.log.warning(f"held back: {located}")
        for incident in log.open_incidents(HELD_BACK):
            _, name, table, stem = incident.key.split(":")
            if name != uc.name:
                continue  # another use case's delivery
            if gate.admitted(table, date.fromisoformat(stem.split(".")[0])):
                log.open_incident(
                    incident.key, incident.kind, incident.severity, incident.summary, recovered_at=sim_now,
                    action=f"{incident.action}; the day was delivered again and admitted, its month rebuilt",
                )  # fmt: skip
    send_alerts(home, alerts, problems)
