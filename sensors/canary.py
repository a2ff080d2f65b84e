"""The canary sensor: each tick it first starts the loop's canary for a challenger that passed its gate
(``keel.loop.promote.start_canary``: a policy commit), then ``keel.canary_control.tick`` drives every running canary
policy one decision, and each commit becomes a run of ``model_deployment`` (run key = the policy version, so a
duplicate tick or a restarted daemon never acts twice). A canary that cannot be judged is reported on
model_deployment's page. Time is the shared clock's (simulated in a live replay, else the wall clock).

One sensor per use case, ``<use case>_canary_sensor`` (``build_canary_sensor``): it starts and drives the canaries of
that use case's model and runs that use case's model_deployment."""

import time

import dagster as dg

from assets.jobs import PRIORITY_ACT, UseCaseJobs
from assets.usecase import wiring
from keel.alerts import Alert
from keel.canary_control import tick
from keel.clock import SimClock
from keel.faults import fault, injected
from keel.loop.estimate import canary_estimate
from keel.loop.promote import LOOP_AUTHOR, LOOP_CANARY, GateResult, StartCanary, start_canary
from keel.metrics import LOSS_NAMES
from keel.usecase import UseCase, plays
from resources.home import KeelHomeResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource
from sensors.alerting import send_alerts
from sensors.problems import automation_problems
from sensors.stepping import interval_s, stepped_tick


def build_canary_sensor(uc: UseCase, jobs: UseCaseJobs) -> dg.SensorDefinition:
    """``<use case>_canary_sensor``: the canaries of the use case's model, one decision per tick, each carried out by
    a run of the use case's ``<use case>_deploy`` job (assets/jobs.py)."""
    w = wiring(uc)
    deployment, evaluation, report = w.key("model_deployment"), w.key("challenger_evaluation"), w.key("loop_report")
    name = f"{uc.name}_canary_sensor"

    @dg.sensor(
        name=name,
        minimum_interval_seconds=interval_s(),
        default_status=dg.DefaultSensorStatus.RUNNING if plays(uc.name) else dg.DefaultSensorStatus.STOPPED,
        jobs=[jobs.deploy],
        description=f"Drives the canary rollouts of {uc.model.name} one decision per tick: advance, hold, promote, "
        "roll back or pause — each decision a policy commit with its evidence, and a model_deployment run.",
    )
    def _sensor(
        context: dg.SensorEvaluationContext,
        policies: PolicyStoreResource,
        registry: ModelRegistryResource,
        keel_home: KeelHomeResource,
    ):
        return stepped_tick(
            context,
            name,
            uc.name,
            keel_home,
            lambda: canary_tick(
                context,
                uc.model.name,
                deployment,
                evaluation,
                name,
                policies,
                registry,
                keel_home,
                usecase=uc.name,
                label_delay_s=uc.loop.label_delay.total_seconds(),
                shadow=uc.loop.shadow,
                loss=LOSS_NAMES[uc.task].replace("_", "-"),
                job=jobs.deploy.name,
                trust=lambda: canary_estimate(
                    uc.task, LOOP_CANARY["max_log_loss_increase"], estimates_held(context.instance, report)
                ),
            ),
        )

    return _sensor


def canary_tick(
    context,
    model: str,
    deployment,
    evaluation,
    name: str,
    policies,
    registry,
    keel_home,
    usecase: str | None = None,
    label_delay_s: float = 0.0,
    loss: str = "log-loss",
    job: str | None = None,
    trust=None,
    shadow: bool = True,
):
    problems: list[str] = []
    home = keel_home.layout()
    sim = SimClock(home.clock, usecase).now()  # the use case's own time span on a shared live clock
    now, sim_now = sim.timestamp(), sim.isoformat(timespec="seconds")
    with policies.open() as store, registry.open() as reg:
        started = start_loop_canary(context, store, reg, model, evaluation, label_delay_s, loss, trust, shadow)
        acted = tick(
            store,
            reg,
            home.exposure_dirs(),
            now,
            storage_dir=home.storage,
            problems=problems,
            models=frozenset({model}),
        )
    severity = {"rollback": "warning", "pause": "warning"}
    send_alerts(
        home,
        [
            Alert(
                f"canary_{a['action']}",
                severity.get(a["action"], "info"),
                f"canary {a['name']}: {a['action']} at {a['percent']:g} %",
                {"policy_version": a["version"], "simulated": sim_now},
                source=name,
            )
            for a in acted
        ],
        problems,
    )
    record_incidents(home, acted, sim_now, name)
    for p in problems:
        context.log.error(p)
    requests = [
        dg.RunRequest(
            run_key=f"canary:{a['name']}:{a['version']}",
            job_name=job,
            tags={
                "keel/canary": a["name"],
                "keel/canary_action": a["action"],
                "keel/policy_version": str(a["version"]),
                "keel/canary_percent": str(a["percent"]),
                "keel/sim_now": sim_now,
                **({"keel/trigger": "drift"} if a["name"] == started else {}),
                **PRIORITY_ACT,
            },
        )
        for a in acted
    ]
    return dg.SensorResult(
        run_requests=requests,
        asset_events=automation_problems(deployment, name, problems),
        skip_reason=None if requests else dg.SkipReason(
            "no canary decision this tick (none running, or holding)" + (f"; {len(problems)} skipped" if problems else "")
            + (f"; {injected('KEEL_FAULT_PROMOTION')}: no promotion" if fault("KEEL_FAULT_PROMOTION") else "")
        ),
    )  # fmt: skip


def latest_gate(instance: dg.DagsterInstance, evaluation: dg.AssetKey) -> GateResult | None:
    """The newest challenger_evaluation, as the decision reads it."""
    records = instance.fetch_materializations(evaluation, limit=1).records
    if not records:
        return None
    meta = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}
    return GateResult(
        passed=bool(meta.get("passed")),
        challenger_version=int(meta["challenger_version"]),
        champion_version=int(meta["champion_version"]),
        gate_month=str(meta.get("gate_month")),
        reason=str(meta.get("reason", "")),
        drift_window=meta.get("drift_window"),
        drift_event=meta.get("drift_event"),
        challenger_run=records[0].run_id,
        evaluation_event=records[0].storage_id,
    )


def start_loop_canary(
    context: dg.SensorEvaluationContext,
    store,
    reg,
    model: str,
    evaluation: dg.AssetKey,
    label_delay_s: float = 0.0,
    loss: str = "log-loss",
    trust=None,
    shadow: bool = True,
) -> str | None:
    """Commit the loop's canary for a challenger that passed its gate (the decision: keel.loop.promote); its name,
    or None when there is nothing to start. ``trust()``: whether and how the canary acts on estimated quality
    (``keel.loop.estimate.canary_estimate``), asked only when a canary starts."""
    champion = reg.alias(model, "champion")
    canaries = {name: dict(p.body) for name, p in store.state().items() if p.type == "canary"}
    gate, version = latest_gate(context.instance, evaluation), reg.version(model, champion) if champion else None
    decision = start_canary(gate, model, version, canaries, label_delay_s, loss, shadow=shadow)
    if not isinstance(decision, StartCanary):
        return None
    if trust is not None and (estimate := trust()):
        decision = start_canary(gate, model, version, canaries, label_delay_s, loss, estimate, shadow)
    store.apply({decision.name: ("canary", decision.body)}, author=LOOP_AUTHOR, reason=decision.reason)
    context.log.info(f"started canary {decision.name}: {decision.reason}")
    return decision.name


def estimates_held(instance: dg.DagsterInstance, report: dg.AssetKey) -> list[list[bool]]:
    """Whether each served version's estimate held, per month the loop reported (oldest first; a month reported again
    counts its newest report): what ``canary_estimate`` trusts."""
    newest: dict[str, list[bool]] = {}
    for record in instance.fetch_materializations(report, limit=60).records:  # newest first
        month, table = record.asset_materialization.partition, record.asset_materialization.metadata.get("estimates")
        if month and month not in newest and isinstance(table, dg.TableMetadataValue):
            newest[month] = [bool(r.data.get("held")) for r in table.records]
    return [newest[m] for m in sorted(newest)]


def record_incidents(home, acted: list[dict], sim_now: str, source: str = "canary_sensor") -> None:
    """A canary rolled back is an incident the platform detected, located and undid by itself: one record each, its
    timeline on the shared clock (detection, the rollback and recovery are the same commit: the split is back to the
    champion when the gateways follow it)."""
    from keel.incidents import IncidentLog

    rollbacks = [a for a in acted if a["action"] == "rollback"]
    if not rollbacks:
        return
    with IncidentLog(home.incidents) as log:
        for a in rollbacks:
            log.open_incident(
                f"canary:{a['name']}",
                "canary_rollback",
                "warning",
                f"canary {a['name']} rolled back",
                located=f"the challenger of {a['name']}: {'; '.join(a.get('reasons', [])) or 'see policy version'}",
                action=f"rolled back to the champion (policy version {a['version']})",
                detected_at=sim_now,
                acted_at=sim_now,
                recovered_at=sim_now,
                source=source,
                details={"policy_version": a["version"], "detected_wall": time.time()},
            )
