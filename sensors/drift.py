"""The drift sensor: new drift reports → freeze drifted features on evidence, and ask for one challenger at a time.

Each tick reads drift_report materializations after its cursor (an event-log storage id; it only moves forward) and
turns the loop's decisions into actions:

- **freeze** (keel.drift.policy.decide, then keel.loop.freeze): a feature is frozen only when its drift reached the
  freeze level *and* the report's evidence says the serving model does better on the month's labelled flights
  with it frozen (the report's ``freeze`` column). Each freeze expires (its ``freeze_expires``, simulated time);
  a clean report unfreezes; a promoted model that learned from the drifted month clears the freeze
  (``freezes_to_clear``, checked every tick). Freezes are recorded in the online store's log and observed on the
  ``feature_freezes`` asset;
- **retrain** (keel.loop.retrain.plan_retrain), in a live replay only: the newest drift report — one that asks
  for retraining (trigger ``drift``) or, every month, one that does not (trigger ``monthly``: a challenger is
  considered on schedule as well as on drift, the expanding refit among its candidates) — leads to at most one
  challenger — a ``<use case>_challenger`` run on the plan's months, whose run key is the
  plan's key (the same data never trains twice), none while a challenger trains or waits for its canary, none while
  a canary runs. Outside a live replay (the set-up's backfill) no challenger is trained: the platform runs once.

One sensor per use case, ``<use case>_drift_sensor`` (``build_drift_sensor``), over that use case's drift reports,
online store, model and challenger job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import dagster as dg

from assets.freezes import freeze_observation
from assets.jobs import PRIORITY_JUDGE, UseCaseJobs
from assets.usecase import wiring
from keel.alerts import Alert
from keel.clock import SimClock
from keel.data.landing import LandingZone
from keel.deploy.plan import running_canary
from keel.drift.policy import DriftPolicy, decide
from keel.loop.arrivals import built_whole
from keel.loop.freeze import ActiveFreeze, freezes_to_clear
from keel.loop.reference import trained_on
from keel.loop.retrain import LoopState, NoRetrain, RetrainPlan, RetrainPolicy, plan_retrain
from keel.usecase import UseCase, plays
from resources.home import KeelHomeResource
from resources.online_store import OnlineStoreResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from resources.simulated import SIM_TAG, simulated_metadata
from sensors.alerting import send_alerts
from sensors.deliveries import built_from
from sensors.problems import automation_problems
from sensors.stepping import interval_s, stepped_tick

DRIFT_POLICY = DriftPolicy()
IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dataclass
class DriftCursor:
    """The last drift report acted on, and the freezes this sensor made: feature → (drift window, expiry)."""

    after: int = 0
    freezes: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None) -> DriftCursor:
        if not text:
            return cls()
        if text.strip().isdigit():  # the cursor of an older keel: a storage id only
            return cls(after=int(text))
        data = json.loads(text)
        return cls(after=int(data["after"]), freezes={k: tuple(v) for k, v in data.get("freezes", {}).items()})

    def dump(self) -> str:
        return json.dumps({"after": self.after, "freezes": {k: list(v) for k, v in sorted(self.freezes.items())}})

    def active(self) -> list[ActiveFreeze]:
        return [ActiveFreeze(f, w, datetime.fromisoformat(e)) for f, (w, e) in sorted(self.freezes.items())]


@dataclass(frozen=True)
class DriftTargets:
    """What one use case's drift sensor reads and drives: its use case, report, challenger job and gate."""

    uc: UseCase
    report: dg.AssetKey
    freezes: dg.AssetKey
    challenger_evaluation: dg.AssetKey
    challenger_job: dg.UnresolvedAssetJobDefinition
    features: dg.AssetKey  # the monthly features a month's delivery builds (labelled only once built whole)
    challenger_ops: tuple[str, ...]  # the ops a challenger run configures (run config is keyed by op name)

    @property
    def sensor_name(self) -> str:
        return f"{self.uc.name}_drift_sensor"

    @property
    def model(self) -> str:
        return self.uc.model.name


def build_drift_sensor(uc: UseCase, jobs: UseCaseJobs) -> dg.SensorDefinition:
    """``<use case>_drift_sensor``: freezes and challengers from the use case's drift reports."""
    w = wiring(uc)
    evaluation = w.key("challenger_evaluation")
    t = DriftTargets(
        uc,
        report=w.key("drift_report"),
        freezes=w.key("feature_freezes"),
        challenger_evaluation=evaluation,
        challenger_job=jobs.challenger,
        features=w.key(uc.feature_table),
        challenger_ops=(w.key("challenger_model").to_python_identifier(), evaluation.to_python_identifier()),
    )

    @dg.sensor(
        name=t.sensor_name,
        minimum_interval_seconds=interval_s(),
        default_status=dg.DefaultSensorStatus.RUNNING if plays(uc.name) else dg.DefaultSensorStatus.STOPPED,
        jobs=[jobs.challenger],
        description=f"{uc.title}: freezes a drifted feature when evidence says serving it frozen is better (each "
        "freeze expires; a promoted model trained on the drift clears it) and, in a live replay, asks for one "
        "challenger at a time trained on the most recent labelled months.",
    )
    def _sensor(
        context: dg.SensorEvaluationContext,
        online_store: OnlineStoreResource,
        registry: ModelRegistryResource,
        policies: PolicyStoreResource,
        keel_home: KeelHomeResource,
    ):
        return stepped_tick(context, t.sensor_name, uc.name, keel_home,
                            lambda: drift_tick(context, t, online_store, registry, policies, keel_home))  # fmt: skip

    return _sensor


def drift_tick(context, t: DriftTargets, online_store, registry, policies, keel_home):
    cursor = DriftCursor.parse(context.cursor)
    before = cursor.dump()
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=t.report, after_storage_id=cursor.after), limit=50, ascending=True
    ).records
    home = keel_home.layout()
    clock = SimClock(home.clock, t.uc.name)
    live, now = clock.state() is not None, clock.now()
    with registry.open() as reg:
        champion = reg.alias(t.model, "champion")
        champion_months = trained_on(reg.get(t.model, champion).metadata) if champion else ()
    problems: list[str] = []
    asks: list[tuple[str, int, str]] = []  # (window, event, why) of the reports that ask for a challenger
    with online_store.open(t.uc) as store:
        frozen_before = store.frozen()
        for record in records:
            window = record.asset_materialization.partition or "unpartitioned"
            try:
                ask = act_on_report(context, store, record, window, cursor, t.uc.features.names, now)
            except Exception as exc:  # noqa: BLE001 - one bad report or freeze must not stop every later tick
                context.log.exception(f"drift report {window} skipped: no freeze or challenger decided from it")
                problems.append(
                    f"drift report {window} (event {record.storage_id}) skipped: {type(exc).__name__}: {exc}"
                )
                continue
            trigger = "drift" if ask else "monthly"  # every month's report considers a challenger, drift or not
            ask = ask or f"monthly: no drift in {window}; a challenger is considered every month"
            asks.append((window, record.storage_id, ask, label_drifted(record, t.uc.features.label.column), trigger))
        for feature, why in freezes_to_clear(cursor.active(), now, champion_months).items():
            if feature in store.frozen():
                store.unfreeze(feature, why, at=now)
                context.log.info(f"unfroze {feature}: {why}")
            cursor.freezes.pop(feature, None)
        # What is served frozen now, on the feature_freezes asset (first tick, and whenever it changed).
        changed = store.frozen() != frozen_before or context.cursor is None
        sim = simulated_metadata({SIM_TAG: now.isoformat(timespec="seconds")}, home.root)
        observations = [freeze_observation(store, t.sensor_name, t.freezes, sim)] if changed else []
        alerts = freeze_alerts(frozen_before, store.frozen(), now, t.sensor_name)
    if records:
        cursor.after = max(cursor.after, records[-1].storage_id)
    requests = []
    if asks:
        if live:
            request = challenger_request(context, t, asks[-1], home, champion_months, policies, now)
            if request is not None:
                requests.append(request)
                alerts.append(
                    Alert(
                        "challenger_requested",
                        "info",
                        f"{request.tags['keel/trigger']} ({request.tags['keel/drift_window']}): challenger "
                        f"{request.tags['keel/plan']}",
                        {"reason": request.tags["keel/reason"], "model": t.model},
                        source=t.sensor_name,
                    )
                )
        else:
            context.log.info("not a live replay: drift does not train challengers (the set-up runs once)")
    send_alerts(home, alerts, problems)
    for p in problems:
        context.log.error(p)
    if not (requests or observations or problems) and cursor.dump() == before:
        return dg.SkipReason(f"no drift report after event {cursor.after}; no freeze to clear")
    return dg.SensorResult(
        run_requests=requests,
        cursor=cursor.dump(),
        asset_events=observations + automation_problems(t.report, t.sensor_name, problems),
    )


def freeze_alerts(
    before: dict[str, float], after: dict[str, float], now: datetime, source: str = "drift_sensor"
) -> list[Alert]:
    """A warning for each feature frozen now (served answers degrade), info for each one live again."""
    simulated = now.isoformat(timespec="seconds")
    out = [
        Alert("drift_freeze", "warning", f"{f} is served frozen at {after[f]:.6g}", {"simulated": simulated},
              source=source)
        for f in sorted(set(after) - set(before))
    ]  # fmt: skip
    out += [
        Alert("drift_unfreeze", "info", f"{f} is served live again", {"simulated": simulated}, source=source)
        for f in sorted(set(before) - set(after))
    ]
    return out


def report_features(value: dg.MetadataValue) -> dict[str, dict]:
    """A drift report's per-feature summary, {feature: {drifted, severity, value, threshold, metric,
    reference_mean, freeze, ...}}: from its table (assets/drift.py), or from the JSON that reports before the table
    carried."""
    if isinstance(value, dg.TableMetadataValue):
        return {r.data["feature"]: dict(r.data) for r in value.records}
    return json.loads(json.dumps(value.value))


def label_drifted(record, label: str) -> bool:
    """Did the drift report find the label itself drifted (its base rate or level moved)? Then a recalibration of
    the champion is a candidate too (keel.loop.candidates)."""
    features = report_features(record.asset_materialization.metadata["features"])
    return bool((features.get(label) or {}).get("drifted"))


def act_on_report(
    context, store, record, window: str, cursor: DriftCursor, freezable: tuple[str, ...], now: datetime
) -> str:
    """The decision for one drift report, carried out: freezes (only on the report's evidence) and unfreezes in the
    online store, each on its own, logged at ``now`` (the shared clock's: simulated in a live replay, on the calendar
    of the freeze's expiry). Returns why it asks for a challenger ("" when it does not)."""
    features = report_features(record.asset_materialization.metadata["features"])
    decision = decide(window, features, DRIFT_POLICY, set(store.frozen()), freezable=set(freezable))
    context.log.info(f"drift decision for {window}: {decision}")
    for name in decision.not_frozen:
        context.log.info(f"{name} drifted in {window} but is not a served feature: retraining only, no freeze")
    for f in decision.freeze:
        evidence = features[f.feature]
        if evidence.get("freeze") is not True or not evidence.get("freeze_expires"):
            context.log.info(
                f"{f.feature} drifted in {window}, not frozen: {evidence.get('freeze_reason') or 'no evidence'}"
            )
            continue
        store.freeze(
            f.feature,
            f"{f.reason}; {evidence['freeze_reason']} (drift_report {window}, event {record.storage_id}; "
            f"expires {evidence['freeze_expires']})",
            f.value,
            at=now,
        )
        cursor.freezes[f.feature] = (window, evidence["freeze_expires"])
    for name in decision.unfreeze:
        store.unfreeze(name, f"no drift in {window}", at=now)
        cursor.freezes.pop(name, None)
    return decision.retrain_reason if decision.retrain else ""


def loop_state(
    instance: dg.DagsterInstance,
    t: DriftTargets,
    home,
    champion_months: tuple[str, ...],
    policies: PolicyStoreResource,
) -> LoopState:
    """What plan_retrain needs to know, read from where it lives: labelled months from the landing zone, the
    champion's window from the registry, a challenger in training (or passed and waiting for its canary) from the
    instance, a running canary from the policy store."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=t.challenger_job.name, statuses=IN_PROGRESS), limit=1
    )  # fmt: skip
    in_training = runs[0].run_id if runs else None
    with policies.open() as store:
        state = store.state()
    canary = running_canary(state, t.model)
    if in_training is None:
        waiting = passed_without_canary(instance, state, t)
        in_training = f"challenger v{waiting} passed its gate, its canary not yet started" if waiting else None
    zone = LandingZone(home.landing, t.uc)
    landed = zone.landed_by_month()
    return LoopState(
        # labelled: every outcome landed *and* the month's features built from all of it — on a busy machine the
        # complete delivery's rebuild can still be queued, and a gate on the month would judge part of it
        labelled=tuple(
            m for m in zone.complete_months() if built_whole(m, landed[m], built_from(instance, t.features, m))
        ),  # fmt: skip
        champion_trained_on=champion_months,
        challenger_in_training=in_training,
        canary_running=canary.name if canary else None,
    )


def passed_without_canary(instance: dg.DagsterInstance, policy_state: dict, t: DriftTargets) -> int | None:
    """The newest challenger whose gate passed and that no canary policy names yet (the canary sensor starts it)."""
    records = instance.fetch_materializations(t.challenger_evaluation, limit=1).records
    if not records:
        return None
    meta = records[0].asset_materialization.metadata
    if not (meta.get("passed") and meta["passed"].value):
        return None
    version = int(meta["challenger_version"].value)
    named = {
        int(p.body.get("challenger_version", -1))
        for p in policy_state.values()
        if p.type == "canary" and p.body.get("model") == t.model
    }
    return None if version in named else version


def challenger_request(
    context, t: DriftTargets, ask, home, champion_months, policies, now: datetime
) -> dg.RunRequest | None:
    window, event, why, label_drift, trigger = ask
    state = loop_state(context.instance, t, home, champion_months, policies)
    plan = plan_retrain(window, state, RetrainPolicy(gate_from_day=t.uc.loop.gate_from_day))
    if isinstance(plan, NoRetrain):
        context.log.info(f"{window} ({why}): no challenger — {plan.reason}")
        return None
    context.log.info(f"{window} ({why}): challenger on {', '.join(plan.train_months)}, gate {plan.gate_month}")
    return challenger_run_request(t, plan, event, why, now, label_drift, trigger)


def challenger_run_request(
    t: DriftTargets,
    plan: RetrainPlan,
    event: int,
    why: str,
    now: datetime,
    label_drift: bool = False,
    trigger: str = "drift",
) -> dg.RunRequest:
    config = {
        "train_months": list(plan.train_months),
        "gate_month": plan.gate_month,
        "gate_from_day": plan.gate_from_day,
        "drift_window": plan.drifted_window,
        "drift_event": event,
        "label_drift": label_drift,
    }
    return dg.RunRequest(
        run_key=f"challenger:{plan.key}",
        job_name=t.challenger_job.name,
        run_config={"ops": {op: {"config": config} for op in t.challenger_ops}},
        tags={
            "keel/trigger": trigger,  # drift, or monthly: the month's report considered one without drift
            "keel/drift_window": plan.drifted_window,
            "keel/drift_event": str(event),
            "keel/plan": plan.key,
            "keel/reason": why[:200],
            "keel/label_drift": str(label_drift).lower(),
            "keel/sim_now": now.isoformat(timespec="seconds"),
            **PRIORITY_JUDGE,
        },
    )
